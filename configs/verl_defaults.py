"""verl's defaults (verl's ppo_trainer.yaml, under jaxrlhf's tree): the base of a verl command line.

`train.py` starts from this file when it is given verl overrides and no --config, as verl's
`main_ppo` starts from its own defaults; `python -m jaxrlhf.verl_compat SCRIPT.sh` prints commands
that name it. The data and the model have no default (as in verl): set them.

    python train.py data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet \
        actor_rollout_ref.model.path=$HOME/models/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=8
"""

from jaxrlhf.config import get_base_config


def get_config():
  return get_base_config()
