"""The function _template.yaml names with `!function utils.mmlu_prompt` (lm-eval resolves it beside the YAML
that names it, and imports this file by path, so it imports nothing from scalelab)."""
from __future__ import annotations


def mmlu_prompt(doc: dict) -> str:
    """The question, its four lettered choices, then "Answer:" (Hendrycks et al. 2021): the text lm-eval's hub
    template renders, "{{question.strip()}}\\nA. {{choices[0]}}\\nB. ...\\nAnswer:"."""
    # A function rather than that Jinja template: lm-eval compiles a Jinja doc_to_text anew on every call,
    # six calls per 5-shot question (five exemplars and the question), which made building full MMLU's
    # 14,042 prompts take about 300 s of CPU.
    letters = "".join(f"\n{letter}. {choice}" for letter, choice in zip("ABCD", doc["choices"], strict=True))
    return f"{doc['question'].strip()}{letters}\nAnswer:"
