"""GRPO on a verifiable task: rollout (generate) -> reward (verify) -> update (policy gradient), each measured."""
