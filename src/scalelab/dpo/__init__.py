"""Preference tuning: LoRA-DPO / IPO / ORPO with TRL + peft, margin tracking, merge and export."""
