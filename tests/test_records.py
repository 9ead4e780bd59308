"""The schemas are the contract with OpenAI strict structured outputs and with vLLM's xgrammar backend."""

import json

import openai
import pytest
from jsonschema import Draft202012Validator

from dimmem.contract.records import (
    TASK_MODELS,
    canonical_json,
    json_schema,
    memory_record,
    response_format,
    window_schema,
)
from dimmem.contract.validate import TurnScope, validate

DESIGN_EXAMPLE = {
    "memories": [
        memory_record(
            source_turns=["t6", "t7"],
            speaker="Caroline",
            content="Caroline attended an LGBTQ support group on 2023-05-07 and found the transgender "
            "stories inspiring.",
            type="episodic",
            time="2023-05-07",
            reason="she wanted support while coming out",
            keywords=["Caroline", "LGBTQ support group", "transgender stories"],
        )
    ]
}
EXAMPLES = {
    "extract": DESIGN_EXAMPLE,
    "parse_query": {
        "target_types": ["episodic"],
        "time": "2023-05",
        "location": None,
        "keywords": ["support group"],
        "need_assistant_context": False,
    },
    "consolidate": {"action": "SUPERSEDE", "memory": DESIGN_EXAMPLE["memories"][0]},
}


def plain_form(node):
    """A pydantic JSON schema in our schema's form: no titles, `T | None` as a type union."""
    if isinstance(node, list):
        return [plain_form(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: (v if k == "properties" else plain_form(v)) for k, v in node.items() if k != "title"}
    if "properties" in node:  # property names are data, not keywords: "title" there would be a field
        node["properties"] = {name: plain_form(v) for name, v in node["properties"].items()}
    variants = node.get("anyOf")
    if variants and {"type": "null"} in variants and len(variants) == 2:
        other = next(v for v in variants if v != {"type": "null"})
        if set(other) == {"type"}:
            node = {k: v for k, v in node.items() if k != "anyOf"}
            node["type"] = [other["type"], "null"]
    return node


def assert_strict(schema):
    """OpenAI strict mode's rules, checked here rather than through a private openai helper: every object
    closed (additionalProperties false) with every property required, in order, and no titles."""

    def objects(node):
        if isinstance(node, dict):
            if node.get("type") == "object":
                yield node
            for value in node.values():
                yield from objects(value)
        elif isinstance(node, list):
            for value in node:
                yield from objects(value)

    found = list(objects(schema))
    assert found
    for obj in found:
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])
        assert "title" not in obj


@pytest.mark.parametrize("task", TASK_MODELS)
def test_openai_strict_conversion_is_a_no_op(task):
    # openai.pydantic_function_tool (public) turns a model into a strict function schema, adding what
    # strict mode needs (closed objects, every property required, no defaults). Nothing to add: the
    # models are strict as defined, and json_schema() is that same schema in its own form.
    model = TASK_MODELS[task]
    tool = openai.pydantic_function_tool(model)["function"]
    assert tool["strict"] is True
    assert tool["parameters"] == model.model_json_schema()
    assert plain_form(tool["parameters"]) == json_schema(task)


@pytest.mark.parametrize("task", TASK_MODELS)
def test_schema_is_strict_everywhere(task):
    assert_strict(json_schema(task))


def test_nullable_fields_are_type_unions():
    memory = json_schema("extract")["$defs"]["MemoryRecord"]["properties"]
    for name in ("time", "location", "reason", "purpose"):
        assert memory[name]["type"] == ["string", "null"]
    assert memory["type"]["enum"] == ["fact", "episodic", "profile"]


@pytest.mark.parametrize("task", TASK_MODELS)
def test_examples_validate_and_mutations_do_not(task):
    validator = Draft202012Validator(json_schema(task))
    example = EXAMPLES[task]
    assert not list(validator.iter_errors(example))
    extra = {**example, "confidence": 0.9}
    assert list(validator.iter_errors(extra))
    missing = dict(example)
    missing.pop(next(iter(missing)))
    assert list(validator.iter_errors(missing))


def test_json_schema_returns_independent_copies():
    json_schema("extract")["properties"].clear()
    assert "memories" in json_schema("extract")["properties"]


def test_response_format_is_strict():
    fmt = response_format("extract")
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"] == json_schema("extract")


def test_canonical_json_is_compact_and_in_contract_order():
    shuffled = {"memories": [dict(reversed(list(DESIGN_EXAMPLE["memories"][0].items())))]}
    text = canonical_json("extract", shuffled)
    assert " " not in text.split('"content"')[0]  # no whitespace between tokens
    assert list(json.loads(text)["memories"][0]) == list(DESIGN_EXAMPLE["memories"][0])
    assert json.loads(text) == DESIGN_EXAMPLE


class TestXGrammar:
    """The schemas compile in xgrammar (vLLM's structured-output backend) and constrain as intended."""

    @pytest.fixture(scope="class")
    @classmethod
    def compiler(cls, qwen3_tokenizer):
        xgr = pytest.importorskip("xgrammar")
        info = xgr.TokenizerInfo.from_huggingface(qwen3_tokenizer)
        return xgr.GrammarCompiler(info, max_threads=2)

    @pytest.mark.parametrize("task", TASK_MODELS)
    def test_compiles_and_accepts_canonical_answers(self, compiler, task):
        import xgrammar as xgr

        compiled = compiler.compile_json_schema(
            json.dumps(json_schema(task))
        )  # vLLM compiles with any_whitespace on
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        assert matcher.accept_string(canonical_json(task, EXAMPLES[task]))
        assert matcher.is_terminated()

    def test_rejects_what_the_schema_forbids(self, compiler):
        import xgrammar as xgr

        compiled = compiler.compile_json_schema(
            json.dumps(json_schema("extract"))
        )  # vLLM compiles with any_whitespace on
        memory = dict(DESIGN_EXAMPLE["memories"][0])
        for bad in ({**memory, "type": "opinion"}, {**memory, "time": 2023}):
            matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
            text = json.dumps({"memories": [bad]}, separators=(",", ":"))
            assert not matcher.accept_string(text)

    def test_window_schema_constrains_pointers_while_decoding(self, compiler):
        import xgrammar as xgr

        compiled = compiler.compile_json_schema(json.dumps(window_schema(SCOPE.citable())))
        memory = {**DESIGN_EXAMPLE["memories"][0], "speaker": "Bob", "source_turns": ["t4"]}
        for answer, accepted in (
            ({"memories": [memory]}, True),
            ({"memories": []}, True),
            ({"memories": [{**memory, "speaker": "Ann"}]}, False),
            ({"memories": [{**memory, "source_turns": ["t2"]}]}, False),
            ({"memories": [memory] * 3}, True),  # three new turns: three memories at most
            ({"memories": [memory] * 4}, False),  # an answer repeating itself ends at the bound
        ):
            matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
            assert matcher.accept_string(canonical_json("extract", answer)) == accepted, answer


SCOPE = TurnScope(
    {"t1": "Ann", "t2": "Bob", "t3": "Ann", "t4": "Bob", "t5": "Ann"}, frozenset({"t3", "t4", "t5"})
)


def test_window_schema_is_strict_and_lists_each_speakers_new_turns():
    schema = response_format("extract", SCOPE.citable())["json_schema"]["schema"]
    assert_strict(schema)  # OpenAI accepts it as strict too
    variants = [
        schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]
        for ref in schema["properties"]["memories"]["items"]["anyOf"]
    ]
    assert [
        (v["properties"]["speaker"]["enum"], v["properties"]["source_turns"]["items"]["enum"])
        for v in variants
    ] == [(["Ann"], ["t3", "t5"]), (["Bob"], ["t4"])]
    assert response_format("extract")["json_schema"]["schema"] == json_schema("extract")


def test_window_schema_answers_pass_the_pointer_rules():
    memory = {**DESIGN_EXAMPLE["memories"][0], "speaker": "Ann", "source_turns": ["t3", "t5"]}
    validator = Draft202012Validator(window_schema(SCOPE.citable()))
    assert (
        validator.is_valid({"memories": [memory]}) and validate("extract", {"memories": [memory]}, SCOPE).ok
    )
    for bad, rule in (
        ({**memory, "source_turns": ["t1"]}, "source_turns_overlap"),
        ({**memory, "source_turns": ["t4"]}, "speaker_mismatch"),
        ({**memory, "source_turns": ["t9"]}, "source_turns_unknown"),
        ({**memory, "source_turns": []}, "source_turns_empty"),
    ):
        assert not validator.is_valid({"memories": [bad]})  # the schema forbids what the rule would reject
        assert rule in {issue.rule for issue in validate("extract", {"memories": [bad]}, SCOPE).issues}
    assert not Draft202012Validator(window_schema({})).is_valid({"memories": [memory]})
