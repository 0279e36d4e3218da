python3 -m verl.trainer.main_generation data.path=$HOME/data/gsm8k/test.parquet
