"""Teacher distillation: label dialogue windows with a large model and build the SFT dataset."""
