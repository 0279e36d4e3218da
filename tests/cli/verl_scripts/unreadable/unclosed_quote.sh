python3 -m verl.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    trainer.experiment_name="qwen_7b \
    trainer.nnodes=1
