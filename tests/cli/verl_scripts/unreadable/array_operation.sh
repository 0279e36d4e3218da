ARGS=( data.train_files=$HOME/data/gsm8k/train.parquet trainer.total_epochs=1 )
python3 -m verl.trainer.main_ppo "${ARGS[@]/#/+}"
