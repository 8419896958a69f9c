"""The measurements behind the README's speed and quality numbers, run as modules from the repository root
(`python -m benchmarks.bench_loop ...`); `python -m benchmarks.gpu_report` runs everything a GPU session owes.
Results and their commands: benchmarks/results/."""
