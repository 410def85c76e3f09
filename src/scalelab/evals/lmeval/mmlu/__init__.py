"""MMLU's task YAMLs and the function they name; a package so that utils.py is installed with the YAMLs."""
