"""scalelab: run, predict and measure the LLM-systems experiments (pretrain, serve, dpo, grpo, calc)."""
__version__ = "0.1.0"
