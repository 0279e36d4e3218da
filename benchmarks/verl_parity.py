"""jaxrlhf.algos vs verl 0.9.1's formulas, every shared function, many seeds: the repeatable comparison.

    python benchmarks/verl_parity.py [--seeds 20]

Runs the cases of tests/algos/verl_parity_cases.py (jaxrlhf against the NumPy transcription of
verl 0.9.1 in tests/algos/verl_reference.py) on random masked inputs with interior holes and a
padding row, prints the largest absolute and relative difference per function and writes them to
benchmarks/results/verl_parity.json. Exits 1 if any comparison exceeds 1e-5 (rtol and atol).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests", "algos")]

import numpy as np  # noqa: E402
import verl_parity_cases as parity  # noqa: E402


def _function(label: str) -> str:
  """'policy_loss/vanilla/token-mean/pg_clipfrac' -> 'policy_loss/vanilla' (the row of the table)."""
  parts = label.split("/")
  return "/".join(parts[:2]) if parts[0] in ("policy_loss", "advantage", "kl_penalty", "agg_loss") else parts[0]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=20)
  args = parser.parse_args(argv)
  rows, failures = {}, []
  for case in sorted(parity.CASES):
    for seed in range(args.seeds):
      for label, ours, want in parity.comparisons(case, seed):
        diff = np.abs(ours - want)
        row = rows.setdefault(_function(label), dict(comparisons=0, max_abs=0.0, max_rel=0.0))
        row["comparisons"] += 1
        row["max_abs"] = max(row["max_abs"], float(diff.max(initial=0.0)))
        row["max_rel"] = max(row["max_rel"], float((diff / np.maximum(np.abs(want), 1e-6)).max(initial=0.0)))
        if not np.allclose(ours, want, **parity.TOL):
          failures.append(f"seed {seed} {label}: max |diff| {diff.max():.3g}")
  print(f"| function | comparisons ({args.seeds} seeds) | max abs diff | max rel diff |")
  print("|---|---|---|---|")
  for name, row in sorted(rows.items()):
    print(f"| {name} | {row['comparisons']} | {row['max_abs']:.2e} | {row['max_rel']:.2e} |")
  os.makedirs(os.path.join(_ROOT, "benchmarks", "results"), exist_ok=True)
  with open(os.path.join(_ROOT, "benchmarks", "results", "verl_parity.json"), "w") as f:
    json.dump(dict(seeds=args.seeds, tolerance=parity.TOL, functions=rows, failures=failures), f, indent=1)
  print(
    "\n".join(failures)
    if failures
    else f"all {sum(r['comparisons'] for r in rows.values())} comparisons agree to {parity.TOL}"
  )
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
