"""From a datagen dataset to training rows: task mixing, tokenization with the serving chat template,
loss on the answer only, and the checks that fail early with a clear message."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from datasets import Dataset, DatasetDict, concatenate_datasets, load_from_disk

from dimmem.contract.tokens import end_of_turn, render_prompt
from dimmem.paths import dataset_folder

REQUIRED_ROLES = ["system", "user", "assistant"]


class DatasetFormatError(ValueError):
    pass


def load_sft_dataset(path: str | Path) -> DatasetDict:
    try:
        folder = dataset_folder(path)
    except FileNotFoundError as exc:
        raise DatasetFormatError(str(exc)) from None
    dataset = load_from_disk(str(folder))
    for name, split in dataset.items():
        if len(split) and "messages" not in split.column_names:
            raise DatasetFormatError(
                f"{folder}[{name}]: no 'messages' column (columns: {split.column_names})"
            )
    return dataset


def mix_tasks(split: Dataset, weights: dict[str, float], seed: int) -> Dataset:
    """Keep `weight` x the rows of each task: a fraction below 1 samples, above 1 repeats."""
    if "task" not in split.column_names:
        return split
    parts = []
    for task, weight in weights.items():
        rows = split.filter(lambda t, task=task: t == task, input_columns="task")
        whole, fraction = int(weight), weight - int(weight)
        parts += [rows] * whole
        if fraction and len(rows):
            parts.append(rows.shuffle(seed=seed).select(range(round(len(rows) * fraction))))
    unknown = set(split.unique("task")) - set(weights)
    if unknown:
        raise DatasetFormatError(f"dataset has tasks {sorted(unknown)} with no weight in task_weights")
    return concatenate_datasets(parts).shuffle(seed=seed) if parts else split.select([])


def tokenize_row(messages: list[dict], tokenizer) -> dict:
    """input_ids and labels: the prompt exactly as served (thinking off), then the answer and its end token.

    Only the answer and the token that closes it (`<|im_end|>` in ChatML) carry loss (labels != -100)."""
    roles = [m.get("role") for m in messages]
    if roles != REQUIRED_ROLES:
        raise DatasetFormatError(f"expected messages with roles {REQUIRED_ROLES}, got {roles}")
    answer = messages[-1]["content"]
    if not answer.strip():
        raise DatasetFormatError("a row has an empty assistant answer: nothing to learn from")
    prompt_ids = tokenizer(render_prompt(tokenizer, messages[:-1]), add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [
        tokenizer.convert_tokens_to_ids(end_of_turn(tokenizer))
    ]
    return {"input_ids": prompt_ids + answer_ids, "labels": [-100] * len(prompt_ids) + answer_ids}


def prepare_split(
    split: Dataset, tokenizer, max_length: int | None, drop_overlong: bool, name: str
) -> Dataset:
    if not len(split):
        return split
    try:
        tokenized = split.map(
            lambda row: tokenize_row(row["messages"], tokenizer),
            remove_columns=split.column_names,
            desc=f"tokenizing {name}",
        )
    except DatasetFormatError as exc:
        raise DatasetFormatError(f"{name}: {exc}") from None
    if max_length is not None:
        lengths = tokenized["input_ids"]
        over = [i for i, ids in enumerate(lengths) if len(ids) > max_length]
        if over and not drop_overlong:
            ids = [split[i].get("window_id", i) for i in over[:5]]
            raise DatasetFormatError(
                f"{name}: {len(over)} row(s) longer than max_length={max_length} (e.g. {ids}); "
                "raise max_length, "
                "re-window with a smaller token budget, or set drop_overlong: true"
            )
        if over:
            print(f"{name}: dropping {len(over)} row(s) longer than max_length={max_length}")
            tokenized = tokenized.select(sorted(set(range(len(tokenized))) - set(over)))
    return tokenized


def packing_fill(tokenized: Dataset, max_length: int) -> tuple[float, float]:
    """Rows per bin, and the share of the bins' max_length their tokens fill, when rows are packed into
    max_length bins (TRL's best-fit decreasing). Bins are padding-free rows, so an unfilled bin pads
    nothing: what the fill says is how many rows (and tokens) a packed batch holds."""
    from trl.data_utils import pack_dataset

    packed = pack_dataset(tokenized.select_columns(["input_ids"]), seq_length=max_length, strategy="bfd")
    real = sum(len(ids) for ids in tokenized["input_ids"])
    return len(tokenized) / len(packed), real / (len(packed) * max_length)


def padding_efficiency(tokenized: Dataset, batch_size: int, grouped: bool = False, seed: int = 0) -> float:
    """Real tokens / total tokens without packing, each batch padded to its longest row, in the order the
    trainer's sampler draws them: a random permutation, or transformers' length-grouped one
    (`train_sampling_strategy: group_by_length`)."""
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths = [len(ids) for ids in tokenized["input_ids"]]
    generator = torch.Generator().manual_seed(seed)
    order = (
        get_length_grouped_indices(lengths, batch_size, generator=generator)
        if grouped
        else torch.randperm(len(lengths), generator=generator).tolist()
    )
    ordered = [lengths[i] for i in order]
    padded = sum(
        max(ordered[i : i + batch_size]) * len(ordered[i : i + batch_size])
        for i in range(0, len(ordered), batch_size)
    )
    return sum(lengths) / padded


def task_counts(split: Dataset) -> dict[str, int]:
    return dict(Counter(split["task"])) if "task" in split.column_names else {"all": len(split)}
