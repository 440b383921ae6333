"""The JSON codec round-trips every JSON value and refuses, with a message that names the
payload, anything that would not come back the same; names are validated strictly."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plunder import errors, payload

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


@given(json_values)
def test_encode_then_decode_round_trips(value: Any) -> None:
    text = payload.encode(value)
    assert payload.decode(text) == value
    assert payload.parse(text) == value
    assert payload.encode(payload.decode(text)) == text  # stable, key order kept


@pytest.mark.parametrize(
    "value",
    [
        "nul\x00inside",
        {"\x00": "\x00"},
        "żółć — 日本語 — 🦀",
        ["\u2028", "\ufeff", "\U0010ffff"],
        {"b": 1, "a": 2},  # key order is kept
        -0.0,
        1e308,
        2**100,
        "",
        [],
        {},
    ],
)
def test_awkward_but_valid_values_round_trip(value: Any) -> None:
    text = payload.encode(value)
    back = payload.decode(text)
    assert back == value and type(back) is type(value)
    if isinstance(value, dict):
        assert list(back) == list(value)


def test_nul_is_stored_escaped_and_non_ascii_text_as_is() -> None:
    text = payload.encode(["a\x00b", "é"])
    assert "\x00" not in text  # PostgreSQL text columns reject NUL
    assert text == '["a\\u0000b","é"]'


def test_decode_of_none_is_none() -> None:
    assert payload.decode(None) is None
    assert payload.encode(None) == "null"


class Opaque:
    pass


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def circular() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


REFUSED = {
    "nan": (math.nan, "JSON-serializable"),
    "infinity": ([1.0, math.inf], "JSON-serializable"),
    "-infinity": ({"x": -math.inf}, "JSON-serializable"),
    "lone-high-surrogate": ("\ud800", "not valid Unicode"),
    "lone-low-surrogate": (["ok", "lone \udfff surrogate"], "not valid Unicode"),
    "surrogate-key": ({"\ud83d": 1}, "not valid Unicode"),
    "object": (Opaque(), "JSON-serializable"),
    "set": ({1, 2}, "JSON-serializable"),
    "bytes": (b"bytes", "JSON-serializable"),
    "datetime": (datetime(2024, 1, 1), "JSON-serializable"),
    "tuple-key": ({(1, 2): "tuple key"}, "JSON-serializable"),
    "circular": (circular(), "JSON-serializable"),
    "huge-int": (10**5000, "JSON-serializable"),
    "one-too-deep": (nested(payload.MAX_NESTING + 1), "nested"),
    "too-deep-in-dict": ({"a": nested(payload.MAX_NESTING)}, "nested"),
    "absurdly-deep": (nested(100_000), "nested"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_values_that_cannot_round_trip_are_refused_naming_what(case: str) -> None:
    value, why = REFUSED[case]
    with pytest.raises(errors.PayloadError, match=why) as caught:
        payload.encode(value, what="arguments of billing.charge")
    assert "arguments of billing.charge" in str(caught.value)


def test_oversized_payloads_are_refused_naming_what() -> None:
    with pytest.raises(errors.PayloadError, match="result of job 7") as caught:
        payload.encode("x" * 100, what="result of job 7", limit=50)
    assert "102 bytes" in str(caught.value)
    assert payload.encode("x" * 48, limit=50) == '"' + "x" * 48 + '"'
    with pytest.raises(errors.PayloadError, match="limit"):
        payload.encode("é" * 30, limit=50)  # the limit counts UTF-8 bytes, not characters
    with pytest.raises(errors.PayloadError, match="limit"):
        payload.encode("x" * payload.MAX_PAYLOAD_BYTES)


def test_the_nesting_limit_is_exact() -> None:
    deepest = nested(payload.MAX_NESTING)
    assert payload.decode(payload.encode(deepest)) == deepest
    wide = [[i] for i in range(payload.MAX_NESTING * 3)]  # many brackets, shallow
    assert payload.decode(payload.encode(wide)) == wide


def test_an_accepted_payload_decodes_from_a_deep_call_stack() -> None:
    """A worker decodes jobs deep inside its own call stack; whatever encode accepted must
    still decode there (Python's decoder recurses once per nesting level)."""
    text = payload.encode(nested(payload.MAX_NESTING))

    def deep(frames: int) -> Any:
        return deep(frames - 1) if frames else payload.decode(text)

    assert deep(500) == nested(payload.MAX_NESTING)


@pytest.mark.parametrize("text", ["NaN", "[1, Infinity]", '{"x": -Infinity}', "[NaN]"])
def test_parse_rejects_nan_and_infinity_literals(text: str) -> None:
    with pytest.raises(errors.PayloadError, match="not allowed") as caught:
        payload.parse(text, what="ARGS_JSON")
    assert "ARGS_JSON" in str(caught.value)


@pytest.mark.parametrize("text", ["", "{", "[1,]", "{'a': 1}", "undefined", '"\\x41"', "[1] 2"])
def test_parse_rejects_invalid_json(text: str) -> None:
    with pytest.raises(errors.PayloadError, match="ARGS_JSON is not valid JSON"):
        payload.parse(text, what="ARGS_JSON")


def test_parse_rejects_absurd_nesting() -> None:
    with pytest.raises(errors.PayloadError, match="nested too deeply"):
        payload.parse("[" * 100_000 + "]" * 100_000, what="body")


def test_parse_accepts_strict_json() -> None:
    assert payload.parse('{"a": [1, 2.5, "\\u00e9", null, true]}') == {
        "a": [1, 2.5, "é", None, True]
    }
    assert json.loads(payload.encode(payload.parse('"\\u0000"'))) == "\x00"


# -- names ----------------------------------------------------------------------------------
HOSTILE = [
    "alpha/../beta",
    "alpha%",
    "alpha ",
    " alpha",
    "alpha\x00beta",
    "alpha\n",
    "\u0430lpha",  # a Cyrillic a (U+0430) in front
    "alpha*",
    "al'pha",
    "",
    "a" * 129,
]


@pytest.mark.parametrize("name", ["alpha", "alpha_", "a", "0queue", "a.b:c-d_e", "a" * 128])
def test_check_queue_accepts_plain_names(name: str) -> None:
    assert payload.check_queue(name) == name


@pytest.mark.parametrize("name", [*HOSTILE, "_alpha", "-alpha", None, 42, b"alpha"])
def test_check_queue_rejects_hostile_names(name: Any) -> None:
    with pytest.raises(errors.InvalidName, match="invalid queue name"):
        payload.check_queue(name)


@pytest.mark.parametrize(
    "name", ["alpha", "alpha_", "_private", "billing.charge", "mod:func", "a-b", "a" * 200]
)
def test_check_task_accepts_plain_names(name: str) -> None:
    assert payload.check_task(name) == name


@pytest.mark.parametrize("name", [*HOSTILE[:-1], "0task", "-task", "a" * 201, None, 3.5])
def test_check_task_rejects_hostile_names(name: Any) -> None:
    with pytest.raises(errors.InvalidName, match="invalid task name"):
        payload.check_task(name)


@pytest.mark.parametrize(
    "key", ["order-42", "alpha ", "alpha/../beta", "\u0430lpha", "100%", "🦀", "k" * 256]
)
def test_check_key_accepts_any_printable_text(key: str) -> None:
    assert payload.check_key(key) == key


def test_check_key_passes_none_through() -> None:
    assert payload.check_key(None) is None


@pytest.mark.parametrize(
    "key", ["", "k" * 257, "alpha\x00beta", "line\nbreak", "tab\t", "\ud800", "\x1b[31m", 42]
)
def test_check_key_rejects_empty_long_or_unprintable_keys(key: Any) -> None:
    with pytest.raises(errors.InvalidName, match="invalid idempotency key"):
        payload.check_key(key)


plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)


@given(
    st.lists(plain_scalars, max_size=8)
    | st.tuples(plain_scalars, plain_scalars)
    | st.dictionaries(st.text(max_size=10), plain_scalars, max_size=5)
    | json_values
)
def test_copy_or_decode_gives_what_the_stored_text_decodes_to(value: Any) -> None:
    text = payload.encode(value)
    got = payload.copy_or_decode(value, text)
    expected = payload.decode(text)
    assert got == expected
    assert type(got) is type(expected)
    if isinstance(got, list | dict):
        assert got is not value  # the caller's later changes do not reach the record
        items = got.values() if isinstance(got, dict) else got
        wanted = expected.values() if isinstance(expected, dict) else expected
        assert [type(i) for i in items] == [type(i) for i in wanted]
        if isinstance(got, dict):
            assert list(got) == list(expected)


_standard = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@given(json_values | st.tuples(json_values, json_values))
def test_encode_writes_what_the_standard_encoder_writes(value: Any) -> None:
    assert payload.encode(value) == _standard.encode(value)  # byte for byte, on every path


def test_the_c_encoder_is_in_use_where_the_interpreter_has_one() -> None:
    # the speed of every enqueue and result depends on it; CPython has it
    assert payload._c_encode is not None


@given(json_values, st.sampled_from(["", " ", "\n", " \t"]), st.sampled_from(["", " ", "\r\n"]))
def test_decode_reads_what_the_standard_decoder_reads(value: Any, before: str, after: str) -> None:
    text = before + json.dumps(value) + after
    assert payload.decode(text) == json.loads(text)


@pytest.mark.parametrize("text", ["[1] x", "[1][2]", "", " ", "nul", "[1", "1 2", "{} {}"])
def test_decode_refuses_what_the_standard_decoder_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        payload.decode(text)


def test_a_payload_that_contains_itself_is_refused_and_the_next_encodes() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(errors.PayloadError, match="Circular reference"):
        payload.encode(loop, what="arguments")
    shared = [1, 2]
    assert payload.encode([shared, shared]) == "[[1,2],[1,2]]"  # shared is not circular


@pytest.mark.parametrize(
    "value", [0, -1, 7, True, False, 10**18 - 1, -(10**18) + 1, 10**18, -(10**18), 2**63, 10**4000]
)
def test_scalars_on_the_short_path_are_written_as_the_encoder_writes_them(value: Any) -> None:
    assert payload.encode(value) == _standard.encode(value)
    assert payload.decode(payload.encode(value)) == value
