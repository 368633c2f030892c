"""Issue 24 item 2: no 5xx from upload validation, and a generator of hostile archives and rows.

The six inputs that answered 500 are pinned first (each a 4xx naming what is wrong, nothing
stored, and the next request on the same connection served). Then hypothesis generates model
archives (hostile names, kinds and contents around a valid model) and dataset rows (deep nesting,
huge integers, odd text) so new checks are fuzzed too: schemathesis cannot send the binary bodies.
Runs on SQLite and PostgreSQL (``client`` takes ``database_url``).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from registry_support import Entry, model_files, model_tar, registry_counts, stored_files
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.settings import Settings

TAR = {"content-type": "application/x-tar"}
JSONL = {"content-type": "application/jsonl"}
CSV = {"content-type": "text/csv"}
DEEP = "[" * 100_000 + "]" * 100_000


def _refused_cleanly(client: TestClient, answer: Any, sessions: sessionmaker[Session], registry: Path) -> str:
    assert 400 <= answer.status_code < 500, answer.text
    assert registry_counts(sessions) == (0, 0) and stored_files(registry) == []
    assert client.get("/healthz").status_code == 200  # the connection and the server are still fine
    return str(answer.json()["detail"])


HOSTILE_MODELS = {
    "config-nested-100k": (model_tar({**model_files(), "config.json": ('{"a":' + DEEP + "}").encode()}), "config.json"),
    "file-and-dir-of-one-name": (model_tar(extra=[Entry("foo", b"x"), Entry("foo/bar", b"y")]), "foo"),
    "dir-under-a-file-first": (model_tar(extra=[Entry("foo/bar", b"y"), Entry("foo", b"x")]), "foo"),
    "part-over-255-ascii": (model_tar(extra=[Entry("a" * 300, b"x")]), "255 bytes"),
    "part-over-255-bytes-utf8": (model_tar(extra=[Entry("€" * 100, b"x")]), "255 bytes"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MODELS))
def test_a_hostile_model_archive_is_a_422_naming_why(
    client: TestClient, sessions: sessionmaker[Session], settings: Settings, case: str
) -> None:
    body, fragment = HOSTILE_MODELS[case]
    detail = _refused_cleanly(
        client, client.post("/models", content=body, headers=TAR), sessions, settings.registry_dir
    )
    assert fragment in detail


HOSTILE_DATASETS = {
    "row-nested-100k": ("chat", JSONL, ('{"messages": ' + DEEP + "}\n").encode(), "nested too deep"),
    "label-5000-digits-jsonl": (
        "classification",
        JSONL,
        ('{"text": "a", "label": 0}\n{"text": "b", "label": ' + "9" * 5000 + "}\n").encode(),
        "4300 digits",
    ),
    "label-5000-digits-csv": ("classification", CSV, ("text,label\na,0\nb," + "9" * 5000 + "\n").encode(), "over"),
    "label-over-65535": (
        "classification",
        JSONL,
        b'{"text": "a", "label": 0}\n{"text": "b", "label": 70000}\n',
        "over",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_DATASETS))
def test_a_hostile_dataset_is_a_422_naming_why(
    client: TestClient, sessions: sessionmaker[Session], settings: Settings, case: str
) -> None:
    fmt, headers, body, fragment = HOSTILE_DATASETS[case]
    answer = client.post("/datasets", params={"format": fmt}, content=body, headers=headers)
    assert fragment in _refused_cleanly(client, answer, sessions, settings.registry_dir)


@pytest.mark.parametrize("path", ["/datasets/%00", "/models/%00", "/datasets/a%00b", "/models/%20"])
def test_an_id_with_a_nul_is_a_4xx_on_every_database(client: TestClient, path: str) -> None:
    for method in ("GET", "DELETE"):
        answer = client.request(method, path)
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"][0] == "path"


# ----------------------------------------------------------------------------- the generators

#: Name parts: mostly plausible (so an archive gets past the early checks to extraction), some hostile.
_PLAUSIBLE = st.text(st.sampled_from("ab€_-"), min_size=1, max_size=300)
_PARTS = st.one_of(
    _PLAUSIBLE,
    _PLAUSIBLE,
    _PLAUSIBLE,
    st.sampled_from(["..", ".", "", "config.json", "model.safetensors", "w.bin", "x.PT", "€" * 90, "a" * 256]),
    st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=12),
)
_NAMES = (
    st.lists(_PARTS, min_size=1, max_size=3).map("/".join)
    | st.lists(_PLAUSIBLE, min_size=8, max_size=11).map("/".join)
    | st.sampled_from(["/etc/x", "./a", "a/", "a\\b"])
)
_KINDS = st.sampled_from([tarfile.REGTYPE] * 4 + [tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE])
_DATA = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"{", b"[" * 5000, b'{"model_type": "llama", "auto_map": {}}', b"\x80\x04\x95pickle"]),
)
_ENTRY = st.builds(
    Entry, name=_NAMES, data=_DATA, kind=_KINDS, target=st.sampled_from(["", "/etc/passwd", "config.json"])
)


@st.composite
def _entries(draw: st.DrawFn) -> list[Entry]:
    """Up to 5 entries, each maybe followed by one under its name (a file and a directory of one name)."""
    entries: list[Entry] = []
    for entry in draw(st.lists(_ENTRY, max_size=5)):
        entries.append(entry)
        if draw(st.booleans()):
            entries.append(Entry(f"{entry.name}/{draw(_PARTS)}", draw(_DATA)))
    return draw(st.permutations(entries))


_FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@_FUZZ
@given(
    entries=_entries(),
    top=st.sampled_from(["", "model"]),
    replace=st.sampled_from(["", "config.json", "model.safetensors"]),
)
def test_generated_archives_never_answer_5xx_and_a_refusal_stores_nothing(
    client: TestClient,
    sessions: sessionmaker[Session],
    settings: Settings,
    entries: list[Entry],
    top: str,
    replace: str,
) -> None:
    files = model_files()
    if replace:
        files[replace] = b"\x80\x04\x95" + bytes(range(40))
    before = registry_counts(sessions), stored_files(settings.registry_dir)
    answer = client.post("/models", content=model_tar(files, top, extra=entries), headers=TAR)
    assert answer.status_code < 500, answer.text
    if answer.status_code != 201:
        assert (registry_counts(sessions), stored_files(settings.registry_dir)) == before, answer.text


_JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_JSON = st.recursive(
    _JSON_LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
)
_FIELDS = st.sampled_from(["text", "label", "messages", "prompt", "completion"])
#: One row of every format, valid: a hostile row comes after some of them, so it is the one the check meets.
_VALID_ROWS = {
    "chat": '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}',
    "text": '{"text": "hi"}',
    "classification": '{"text": "a", "label": 0}',
    "completion": '{"prompt": "a", "completion": "b"}',
}
_HOSTILE_ROW = st.one_of(
    st.dictionaries(_FIELDS, _JSON, max_size=4).map(json.dumps),
    st.tuples(_FIELDS, st.integers(min_value=1, max_value=3000)).map(
        lambda deep: '{"%s": %s}' % (deep[0], "[" * deep[1] + "]" * deep[1])  # noqa: UP031
    ),
    st.tuples(_FIELDS, st.integers(min_value=1, max_value=6000)).map(
        lambda big: '{"text": "a", "%s": %s}' % (big[0], "9" * big[1])  # noqa: UP031  # no int() of 6000 digits
    ),
    st.text(max_size=30),
)


@_FUZZ
@given(fmt=st.sampled_from(sorted(_VALID_ROWS)), valid=st.integers(0, 2), hostile=_HOSTILE_ROW)
def test_generated_rows_never_answer_5xx_and_a_refusal_stores_nothing(
    client: TestClient, sessions: sessionmaker[Session], settings: Settings, fmt: str, valid: int, hostile: str
) -> None:
    before = registry_counts(sessions), stored_files(settings.registry_dir)
    body = "\n".join([_VALID_ROWS[fmt]] * valid + [hostile]).encode("utf-8", "surrogatepass")
    answer = client.post("/datasets", params={"format": fmt}, content=body, headers=JSONL)
    assert answer.status_code < 500, answer.text
    if answer.status_code != 201:
        assert (registry_counts(sessions), stored_files(settings.registry_dir)) == before, answer.text


@_FUZZ
@given(label=st.one_of(st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n), st.text(max_size=20)))
def test_generated_csv_labels_never_answer_5xx(
    client: TestClient, sessions: sessionmaker[Session], settings: Settings, label: str
) -> None:
    before = registry_counts(sessions), stored_files(settings.registry_dir)
    body = f"text,label\na,0\nb,{label}\n".encode("utf-8", "surrogatepass")
    answer = client.post("/datasets", params={"format": "classification"}, content=body, headers=CSV)
    assert answer.status_code < 500, answer.text
    if answer.status_code != 201:
        assert (registry_counts(sessions), stored_files(settings.registry_dir)) == before, answer.text
