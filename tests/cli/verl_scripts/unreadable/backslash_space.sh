# verl's examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh in shape: a comment after `\ ` on line 5 ends the
# command there, and bash passes ' ' to verl (whose Hydra refuses it).
python3 -m verl.trainer.main_ppo \
    algorithm.use_pf_ppo=True \
    algorithm.pf_ppo.reweight_method=pow \  # ["pow", "max_min", "max_random"]
    algorithm.pf_ppo.weight_pow=2.0 \
    trainer.total_epochs=15
