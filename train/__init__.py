"""LoRA SFT of the compact extractor (TRL + PEFT), launch configs, export to the Hugging Face Hub."""
