"""Convert a local copy of MATH into verl's parquet row format (docs/algorithms.md §8); no network access.

    python examples/data_preprocess/math.py --local_dir ~/raw/MATH-lighteval/data --output_dir ~/data/math

``--local_dir`` is a directory holding ``train*`` / ``test*`` files (.jsonl, .json or .parquet), or
one such file. Each row needs ``problem`` and ``solution``; the ground truth is the solution's last
``\\boxed{...}``, as in verl's math_dataset.py. Other columns (``level``, ``type``) are kept.
"""

import importlib.util
import os
import sys

# This file is named math.py: drop its directory from sys.path before anything imports the stdlib's.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]

try:
  from jaxrlhf.rewards.math import extract_boxed_answer
except ImportError:  # run from a checkout without `pip install -e .`
  sys.path.append(os.path.dirname(os.path.dirname(_HERE)))
  from jaxrlhf.rewards.math import extract_boxed_answer

# Reading, row layout and writing are shared with gsm8k.py (loaded by path: this folder is not a package).
_spec = importlib.util.spec_from_file_location("jaxrlhf_preprocess_gsm8k", os.path.join(_HERE, "gsm8k.py"))
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"  # 'lighteval/MATH' is gone from the Hub; verl uses this
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def main(argv=None):
  return _common.convert(
    argv,
    description=__doc__.splitlines()[0],
    default_output_dir="~/data/math",
    default_data_source=DATA_SOURCE,
    question_column="problem",
    answer_column="solution",
    ground_truth_fn=extract_boxed_answer,
    instruction=INSTRUCTION,
  )


if __name__ == "__main__":
  try:
    main()
  except (OSError, ValueError) as error:  # bad input: one clear line, no traceback
    sys.exit(f"error: {error}")
