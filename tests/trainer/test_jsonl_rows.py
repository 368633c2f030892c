"""Reading ``jsonl`` dataset files: CSV quoting, BOM/CRLF/blank lines, every malformed row (file, line, field)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_tokenizer_support import hf_tokenizer_fixture  # noqa: F401 (the hf_tokenizer fixture)
from jsonl_support import DataRoot, every_sample, trained_spans

from trainer.data.jsonl.rows import read_rows
from trainer.errors import TrainerError


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DataRoot:
    return DataRoot(tmp_path / "root", monkeypatch)


def _texts(hf_tokenizer, dataset) -> set[str]:
    return {trained_spans(hf_tokenizer, sample.targets)[0].removesuffix("</s>") for sample in every_sample(dataset)}


def test_csv_quoted_commas_quotes_and_multiline_fields(hf_tokenizer, root: DataRoot) -> None:
    content = 'id,text\n1,"a, b"\n2,"say ""hi"""\n3,"two\nlines"\n4,plain\n'
    dataset = root.build(hf_tokenizer, root.write("d.csv", content), format="text", test_fraction=0.25)
    assert _texts(hf_tokenizer, dataset) == {"a, b", 'say "hi"', "two\nlines", "plain"}


def test_csv_rows_are_numbered_by_the_line_they_start_on(root: DataRoot) -> None:
    root.write("d.csv", 'text,label\n"one\ntwo\nthree",a\n\nb,c\n')
    assert [row.line for row in read_rows("d.csv", "csv", 1000)] == [2, 6]


def test_jsonl_bom_crlf_and_blank_lines(hf_tokenizer, root: DataRoot) -> None:
    content = b"\xef\xbb\xbf" + b'{"text": "alpha"}\r\n\r\n   \r\n{"text": "beta"}\r\n{"text": "gamma"}'
    root.write("d.jsonl", content)
    assert [row.line for row in read_rows("d.jsonl", "jsonl", 1000)] == [1, 4, 5]
    dataset = root.build(hf_tokenizer, "d.jsonl", format="text", test_fraction=0.3)
    assert _texts(hf_tokenizer, dataset) == {"alpha", "beta", "gamma"}


def test_csv_bom_and_crlf(hf_tokenizer, root: DataRoot) -> None:
    content = b'\xef\xbb\xbftext\r\n"x\r\ny"\r\nbeta\r\ngamma\r\n'
    dataset = root.build(hf_tokenizer, root.write("d.csv", content), format="text", test_fraction=0.3)
    assert _texts(hf_tokenizer, dataset) == {"x\r\ny", "beta", "gamma"}  # a quoted line break is the data's own


def _chat(*roles: str) -> dict:
    return {"messages": [{"role": role, "content": f"{role} says"} for role in roles]}


GOOD_CHAT = json.dumps(_chat("user", "assistant"))
BAD_ROWS: dict[str, tuple[str, str, dict, str]] = {
    # case: (file name, line 3 onwards of the file, config, message after "data_unavailable: ")
    "invalid_json": (
        "d.jsonl",
        '{"text": "a",}',
        {"format": "text"},
        "file d.jsonl, line 3: invalid JSON: Expecting property name enclosed in double quotes at column 14",
    ),
    "json_array_file": (
        "d.jsonl",
        '[{"text": "a"}]',
        {"format": "text"},
        "file d.jsonl, line 3: expected a JSON object, got array",
    ),
    "not_an_object": (
        "d.jsonl",
        '"just text"',
        {"format": "text"},
        "file d.jsonl, line 3: expected a JSON object, got string",
    ),
    "missing_field": ("d.jsonl", '{"txt": "a"}', {"format": "text"}, "file d.jsonl, line 3: field text: missing"),
    "wrong_type": (
        "d.jsonl",
        '{"text": 5}',
        {"format": "text"},
        "file d.jsonl, line 3: field text: expected a string, got number",
    ),
    "empty_text": ("d.jsonl", '{"text": "  "}', {"format": "text"}, "file d.jsonl, line 3: field text: empty"),
    "missing_output": (
        "d.jsonl",
        '{"instruction": "a"}',
        {"format": "instruction"},
        "file d.jsonl, line 3: field output: missing",
    ),
    "input_not_text": (
        "d.jsonl",
        '{"instruction": "a", "input": [], "output": "b"}',
        {"format": "instruction"},
        "file d.jsonl, line 3: field input: expected a string, got array",
    ),
    "empty_messages": (
        "d.jsonl",
        '{"messages": []}',
        {"format": "chat"},
        "file d.jsonl, line 3: field messages: empty: a chat needs at least one message",
    ),
    "messages_not_an_array": (
        "d.jsonl",
        '{"messages": {"role": "user"}}',
        {"format": "chat"},
        "file d.jsonl, line 3: field messages: expected an array of messages, got object",
    ),
    "unknown_role": (
        "d.jsonl",
        json.dumps(_chat("user", "bot")),
        {"format": "chat"},
        "file d.jsonl, line 3: field messages[1].role: unknown role 'bot' "
        "(expected one of system, user, assistant, tool)",
    ),
    "missing_role": (
        "d.jsonl",
        '{"messages": [{"content": "a"}]}',
        {"format": "chat"},
        "file d.jsonl, line 3: field messages[0].role: missing",
    ),
    "content_not_text": (
        "d.jsonl",
        '{"messages": [{"role": "user", "content": null}]}',
        {"format": "chat"},
        "file d.jsonl, line 3: field messages[0].content: expected a string, got null",
    ),
    "message_not_an_object": (
        "d.jsonl",
        '{"messages": ["hi"]}',
        {"format": "chat"},
        "file d.jsonl, line 3: field messages[0]: expected a message object, got string",
    ),
    "no_assistant_turn": (
        "d.jsonl",
        json.dumps(_chat("system", "user")),
        {"format": "chat"},
        "file d.jsonl, line 3: field messages: no assistant turn to train (masking 'assistant')",
    ),
    "no_assistant_turn_last": (
        "d.jsonl",
        json.dumps(_chat("user", "tool")),
        {"format": "chat", "masking": "last"},
        "file d.jsonl, line 3: field messages: no assistant turn to train (masking 'last')",
    ),
    "negative_label": (
        "d.jsonl",
        '{"text": "a", "label": -1}',
        {"format": "classification"},
        "file d.jsonl, line 3: field label: class id -1 is negative",
    ),
    "label_not_id_or_name": (
        "d.jsonl",
        '{"text": "a", "label": 1.5}',
        {"format": "classification"},
        "file d.jsonl, line 3: field label: expected an integer class id or a class name, got number",
    ),
    "csv_field_count": (
        "d.csv",
        "c,d,e",
        {"format": "classification"},
        "file d.csv, line 3: 3 fields, the header has 2",
    ),
    "csv_bad_quote": (
        "d.csv",
        'x,"y"z',
        {"format": "classification"},
        "file d.csv, line 3: malformed CSV: ',' expected after '\"'",
    ),
    "csv_unclosed_quote": (
        "d.csv",
        'x,"y\nz',
        {"format": "classification"},
        "file d.csv, line 3: malformed CSV: unexpected end of data",
    ),
    "not_utf_8": (
        "d.jsonl",
        '{"text": "caf\xe9"}',
        {"format": "text"},
        "file d.jsonl, line 3: not UTF-8 text (invalid continuation byte at byte 13)",
    ),
}
GOOD_LINES = {
    "text": '{"text": "a"}\n{"text": "b"}\n',
    "instruction": '{"instruction": "a", "output": "b"}\n' * 2,
    "chat": f"{GOOD_CHAT}\n{GOOD_CHAT}\n",
    "classification": '{"text": "a", "label": 0}\n' * 2,
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_malformed_row_fails_naming_file_line_and_field(hf_tokenizer, root: DataRoot, case: str) -> None:
    name, line, config, message = BAD_ROWS[case]
    good = "text,label\na,0\n" if name == "d.csv" else GOOD_LINES[config["format"]]
    content = good.encode() + (line.encode("latin-1") if case == "not_utf_8" else line.encode()) + b"\n"
    with pytest.raises(TrainerError) as info:
        root.build(hf_tokenizer, root.write(name, content), **config)
    assert (info.value.reason, info.value.message) == ("data_unavailable", message)


def test_a_missing_csv_column_fails_at_the_first_row(hf_tokenizer, root: DataRoot) -> None:
    with pytest.raises(TrainerError, match=r"^data_unavailable: file d\.csv, line 2: field output: missing$"):
        root.build(hf_tokenizer, root.write("d.csv", "instruction,answer\na,b\n"), format="instruction")


def test_a_line_after_blank_lines_is_numbered_physically(hf_tokenizer, root: DataRoot) -> None:
    with pytest.raises(TrainerError, match=r"file d\.jsonl, line 4: field text: missing"):
        root.build(hf_tokenizer, root.write("d.jsonl", '{"text": "a"}\n\n\r\n{"x": 1}\n'), format="text")


def test_a_file_of_blank_lines_holds_no_rows(hf_tokenizer, root: DataRoot) -> None:
    with pytest.raises(TrainerError, match="holds no rows"):
        root.build(hf_tokenizer, root.write("d.jsonl", "\n \n\r\n"), format="text")


def test_a_file_over_max_bytes_is_refused_not_cut(hf_tokenizer, root: DataRoot) -> None:
    path = root.write("d.jsonl", '{"text": "abc"}\n' * 10)
    with pytest.raises(
        TrainerError, match=r"^data_unavailable: dataset file 'd\.jsonl' is 160 bytes, over max_bytes \(159\)$"
    ):
        root.build(hf_tokenizer, path, format="text", max_bytes=159)
    assert root.build(hf_tokenizer, path, format="text", max_bytes=160).report["rows"] == 10


def test_a_non_utf8_byte_deep_in_a_csv_is_reported_at_its_own_line(hf_tokenizer, root: DataRoot) -> None:
    content = b"text,label\n" + b"".join(b"row %d,a\n" % i for i in range(2000)) + b"caf\xe9,b\n"
    with pytest.raises(TrainerError, match=r"^data_unavailable: file d\.csv, line 2002: not UTF-8 text"):
        root.build(hf_tokenizer, root.write("d.csv", content), format="classification")
