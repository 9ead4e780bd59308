"""The record contract: the DimMem record and its schemas (records), the one validator (validate), the
time format (timespan), conversations and their loaders, overlap-aware windows, versioned prompts, the
target tokenizer and chat template (tokens), and the generated toy world with its ground truth."""
