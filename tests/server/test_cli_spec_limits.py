"""The CLI reads spec files safely: no code from YAML tags, and bounded size, alias expansion and nesting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from live_server import free_port

from halfcast.cli import main as cli_main
from halfcast.cli.jobs import SpecFileError, load_spec
from halfcast.cli.spec_limits import MAX_SPEC_BYTES

#: Seconds a refused spec may take at most (a billion laughs expanded would take hours and all memory).
FAST_S = 10.0


def billion_laughs(levels: int = 7) -> str:
    """A YAML document of < 1 KB that expands to 9**levels strings (4.8 million: over the limit, yet cheap
    enough that a broken limit fails this test instead of exhausting the machine's memory)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ",".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _refused(path: Path, match: str) -> None:
    started = time.monotonic()
    with pytest.raises(SpecFileError, match=match):
        load_spec(str(path))
    assert time.monotonic() - started < FAST_S


def test_a_billion_laughs_document_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    assert path.stat().st_size < 1024
    _refused(path, "expands to more than")


def test_a_deeply_nested_document_is_refused(tmp_path: Path) -> None:
    for name in ("deep.yaml", "deep.json"):
        path = tmp_path / name
        path.write_text("[" * 100_000 + "]" * 100_000)
        _refused(path, "nested too deeply")


def test_an_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("name: x\n" + "#" * MAX_SPEC_BYTES + "\n")
    _refused(path, "larger than")


def test_python_tags_are_not_constructed(tmp_path: Path) -> None:
    """``yaml.safe_load``: a tag that would run code is a parse error, and nothing runs."""
    marker = tmp_path / "ran"
    path = tmp_path / "evil.yaml"
    path.write_text(f'!!python/object/apply:os.system ["touch {marker}"]\n')
    _refused(path, "not valid YAML")
    assert not marker.exists()


def test_submit_reports_the_limit_as_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    assert cli_main(["submit", "--url", f"http://127.0.0.1:{free_port()}", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "expands to more than" in err and err.count("\n") == 1


def test_a_normal_spec_with_an_alias_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("model: {name: mlp}\ndataset: &d {name: synthetic}\nname: run\nextra: *d\n")
    assert load_spec(str(path))["extra"] == {"name": "synthetic"}
