"""lm-eval task definitions (YAML + utils.py) for the local copies of HellaSwag, ARC, PIQA, MMLU and TruthfulQA.

Each task reads the hub-schema jsonl that `scalelab.evals.localdata` writes; its `data_files` name files
relative to the converted set's folder (`<dataset>/<split>.jsonl`), and `scalelab.evals.harness` binds
them to the cached copies at run time. lm-eval loads utils.py by path, next to the YAML that names it.
"""
