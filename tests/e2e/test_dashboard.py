"""The web dashboard in headless Chromium (Debian's ``chromium``, driven by Playwright) on the real stack.

Signs in with the stack's token (a wrong one is refused; signing out asks again),
submits a spec through the form (first a bad one: the 422 errors appear next to
their lines), watches the job reach ``succeeded`` with its charts drawn, cancels
another job from its page, sees a failed job's reason, and watches the job list
update without a reload. On the Datasets and Models pages it uploads a JSON-lines file (its progress reaching
100%, a bad file's 422 naming the line), a tiny Llama as a tar and as a directory the page packs itself,
finds them offered by name in the submit form, and deletes them. Screenshots go to ``test-artifacts/dashboard-*.png``.
The submit form's error marks are also checked without a stack: the page's static files
are served from the package and ``POST /jobs`` answers the 422 the API would
(:func:`_rejection`), so a nested field's mark lands on its own line; so are the registry pages with canned
answers (the Content-Type each upload is sent with, a 409/413/415/422/429 shown whole), the tar the page packs (read
by Python's tarfile) and the spec edit that puts a registered id in the form's text.
Skipped when Chromium or the ``playwright`` package is missing, unless
``HALFCAST_REQUIRE_SERVICES=1`` (CI, which installs both) makes that a failure.
"""

from __future__ import annotations

import hashlib
import io
import json
import mimetypes
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from e2e_support import ROOT, Stack, load_example
from fastapi.encoders import jsonable_encoder
from pydantic import ValidationError

from halfcast.contracts.spec import JobSpec
from server.http.field_paths import with_field
from server.routes.dashboard import static_dir
from server.schemas import JobPublic

pytestmark = pytest.mark.e2e

CHROMIUM = Path(os.environ.get("HALFCAST_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = ROOT / "test-artifacts"
#: Milliseconds to wait for a job to finish in the browser.
JOB_TIMEOUT_MS = 180_000

GOOD_SPEC = """\
name: dashboard-fp16
model:
  name: mlp
  config:
    hidden_sizes: [64, 64]
dataset:
  name: synthetic
  config: {task: regression, num_samples: 2048}
precision: fp16
loss_scale:
  mode: dynamic
  init_scale: 16777216
  growth_interval: 20
micro_batch_size: 32
max_steps: 80
eval_interval: 40
log_interval: 1
faults:
  nonfinite_grad_steps: [30, 31, 55]
  sleep_per_step_s: 0.03
"""
BAD_SPEC = GOOD_SPEC.replace("micro_batch_size: 32", "micro_batch_size: 0").replace(
    "max_steps: 80", "max_steps: 80\nbogus_field: 1"
)

#: Counts canvas pixels: all drawn ones, and those close to an RGB colour (a series' stroke).
COUNT_PIXELS = """([canvas, rgb]) => {
  const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let drawn = 0, colour = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] === 0) continue;
    drawn++;
    if (Math.abs(d[i] - rgb[0]) < 40 && Math.abs(d[i + 1] - rgb[1]) < 40 && Math.abs(d[i + 2] - rgb[2]) < 40) colour++;
  }
  return [drawn, colour];
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = None if CHROMIUM.exists() else f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    try:
        from playwright import sync_api
    except ImportError:
        missing = missing or "the playwright package is not installed (pip install -e '.[test]')"
    if missing is not None:
        if os.environ.get("HALFCAST_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{missing} (HALFCAST_REQUIRE_SERVICES=1)")
        pytest.skip(missing)
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, embedded_stack: Stack) -> Iterator[Any]:
    context = browser.new_context(
        viewport={"width": 1280, "height": 1100}, base_url=str(embedded_stack.client.base_url)
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if _unexpected(message) else None)
    page.set_default_timeout(30_000)
    _sign_in(page, embedded_stack)
    yield page
    context.close()
    assert errors == [], errors


def _member_text(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    """A regular member's content as text (``extractfile`` gives None only for what is not a file)."""
    file = tar.extractfile(member)
    assert file is not None, member.name
    return file.read().decode()


def _sign_in(page: Any, stack: Stack) -> None:
    """Paste the stack's token into the login view (the tab keeps it; streams use the cookie it gets)."""
    from playwright.sync_api import expect

    assert stack.token is not None
    page.goto("/")
    page.get_by_test_id("login-token").fill(stack.token)
    page.get_by_test_id("login-submit").click()
    expect(page.get_by_test_id("who")).to_have_text("e2e (admin)")


def test_the_dashboard_asks_for_a_token_refuses_a_wrong_one_and_signs_out(browser: Any, embedded_stack: Stack) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(base_url=str(embedded_stack.client.base_url))
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto("/#/submit")
    expect(page.get_by_test_id("login-form")).to_be_visible()
    page.get_by_test_id("login-token").fill("hc_wrong")
    page.get_by_test_id("login-submit").click()
    expect(page.get_by_test_id("login-error")).to_contain_text("unknown or revoked")
    _shot(page, "login")
    _sign_in(page, embedded_stack)
    expect(page.get_by_test_id("nav-jobs")).to_be_visible()
    cookies = {cookie["name"]: cookie for cookie in context.cookies()}
    assert cookies["halfcast_session"]["httpOnly"] and cookies["halfcast_session"]["sameSite"] == "Strict"
    page.get_by_test_id("logout").click()
    expect(page.get_by_test_id("login-form")).to_be_visible()
    page.reload()
    expect(page.get_by_test_id("login-form")).to_be_visible()  # nothing kept: token and cookie are gone
    context.close()


def _spec(label: str, **overrides: Any) -> dict[str, Any]:
    """The synthetic example named ``label`` with ``overrides``."""
    spec = load_example("synthetic-fp16.json", **overrides)
    spec["name"] = label
    return spec


#: Statuses the pages expect and show (a bad spec's or upload's 422, the 401 before login, an upload's 413 or 429, the 409 of
#: deleting a dataset in use): Chromium notes each as a console error.
EXPECTED_STATUSES = (401, 409, 413, 415, 422, 429)


def _unexpected(message: Any) -> bool:
    """A console error other than Chromium's note on an answer the page expects (:data:`EXPECTED_STATUSES`)."""
    return bool(
        message.type == "error" and not any(f"status of {status}" in message.text for status in EXPECTED_STATUSES)
    )


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def _pixels(page: Any, testid: str, rgb: tuple[int, int, int]) -> tuple[int, int]:
    canvas = page.locator(f"[data-testid={testid}] canvas")
    drawn, colour = canvas.evaluate(COUNT_PIXELS.replace("([canvas, rgb])", "(canvas, rgb)"), list(rgb))
    return int(drawn), int(colour)


def test_submit_through_the_form_and_watch_the_job_succeed_with_charts(page: Any) -> None:
    from playwright.sync_api import expect

    page.goto("/#/submit")
    editor = page.get_by_test_id("spec")
    editor.fill(BAD_SPEC)
    page.get_by_test_id("submit").click()
    expect(page.get_by_test_id("errors").locator("li")).to_have_count(2)
    marks = page.get_by_test_id("gutter").locator(".mark")
    lines = BAD_SPEC.split("\n")
    expected = {str(lines.index("micro_batch_size: 0") + 1), str(lines.index("bogus_field: 1") + 1)}
    assert {marks.nth(i).get_attribute("data-line") for i in range(marks.count())} == expected
    expect(page.locator(f".gutter [data-line='{lines.index('micro_batch_size: 0') + 1}']")).to_contain_text(
        "greater than or equal to 1"
    )
    expect(page.get_by_test_id("errors")).to_contain_text("bogus_field")
    _shot(page, "submit-422")

    editor.fill(GOOD_SPEC)
    page.get_by_test_id("submit").click()
    page.wait_for_url("**/#/jobs/*")
    status = page.locator(".job-header [data-testid=status]")
    expect(status).to_have_text("running", timeout=JOB_TIMEOUT_MS)
    expect(status).to_have_text("succeeded", timeout=JOB_TIMEOUT_MS)
    for testid in ("chart-loss", "chart-scale", "chart-throughput"):
        expect(page.get_by_test_id(testid)).to_have_attribute("data-points", "80")
    page.wait_for_timeout(300)  # one animation frame after the last data
    assert _pixels(page, "chart-loss", (0x1F, 0x6F, 0xEB))[1] > 100, "no loss line drawn"
    assert _pixels(page, "chart-scale", (0x82, 0x50, 0xDF))[1] > 100, "no loss-scale line drawn"
    assert _pixels(page, "chart-scale", (0xD1, 0x24, 0x2F))[1] > 20, "no overflow marks drawn"
    assert _pixels(page, "chart-throughput", (0x1A, 0x7F, 0x37))[1] > 100, "no throughput line drawn"
    expect(page.get_by_test_id("job-eval")).to_contain_text("Evaluation at step 80")
    history = page.get_by_test_id("eval-history").locator("li")  # the validation curve: every evaluation
    expect(history).to_have_count(2)
    expect(history.first).to_contain_text("step 40: loss")
    expect(page.get_by_test_id("job-progress")).to_contain_text("80/80")
    # overflow forensics of the last injected overflow (the fault hits the first parameter, "0.weight")
    expect(page.get_by_test_id("job-stats")).to_contain_text("step 55: 0.weight (inf) on rank 0")
    expect(page.get_by_test_id("cancel")).to_be_disabled()
    # the trained weights: the final checkpoint first, a link the session cookie downloads
    checkpoint = page.get_by_test_id("checkpoint").first
    expect(checkpoint).to_contain_text("final.pt step 80, attempt 1")
    expect(checkpoint).to_contain_text("(final weights)")
    link = checkpoint.locator("a")
    download = page.request.get(link.get_attribute("href"))
    assert download.status == 200 and download.headers["content-type"] == "application/octet-stream"
    assert len(download.body()) == int(download.headers["content-length"]) > 0
    assert link.get_attribute("download").endswith("-attempt-1-final.pt")
    _shot(page, "job-succeeded")


def test_cancel_a_running_job_from_its_page(page: Any, embedded_stack: Stack) -> None:
    from playwright.sync_api import expect

    spec = _spec(
        "to-cancel", max_steps=100_000, log_interval=1, checkpoint_interval=20, faults={"sleep_per_step_s": 0.1}
    )
    job = embedded_stack.submit(spec)
    page.goto(f"/#/jobs/{job['id']}")
    status = page.locator(".job-header [data-testid=status]")
    expect(status).to_have_text("running", timeout=JOB_TIMEOUT_MS)
    button = page.get_by_test_id("cancel").element_handle()
    expect(page.get_by_test_id("chart-loss")).not_to_have_attribute("data-points", "0", timeout=60_000)
    page.wait_for_timeout(1000)  # several redraws of the page as steps stream in
    # the button is never replaced: a redraw between mousedown and mouseup would lose the click
    assert button.evaluate("b => b.isConnected"), "the cancel button was replaced by a redraw"
    # a checkpoint written mid-run shows up while the job runs (no status change in between)
    expect(page.get_by_test_id("checkpoint").last).to_contain_text("step-20.pt step 20, attempt 1", timeout=30_000)
    assert embedded_stack.job(job["id"])["status"] == "running"
    page.get_by_test_id("cancel").click()
    expect(status).to_have_text("cancelled", timeout=60_000)
    assert embedded_stack.job(job["id"])["status"] == "cancelled"
    _shot(page, "job-cancelled")


def test_a_failed_job_shows_its_reason_and_the_list_updates_live(page: Any, embedded_stack: Stack) -> None:
    from playwright.sync_api import expect

    page.goto("/")
    expect(page.get_by_test_id("job-list")).to_be_visible()
    job = embedded_stack.submit(_spec("will-fail", max_steps=20, faults={"raise_at_step": 3}))
    row = page.locator(f"[data-job-id='{job['id']}']")
    expect(row).to_be_visible(timeout=10_000)  # appears without a reload
    link = row.get_by_role("link").element_handle()
    expect(row.get_by_test_id("status")).to_have_text("failed", timeout=JOB_TIMEOUT_MS)
    # refreshed in place through every status: a refresh between mousedown and mouseup would lose a click
    assert link.evaluate("a => a.isConnected"), "the job's link was replaced by a refresh"
    _shot(page, "job-list")
    row.get_by_role("link").click()
    expect(page.get_by_test_id("job-error")).to_contain_text("rank_failed")
    expect(page.get_by_test_id("job-error")).to_contain_text("raise_at_step 3")
    _shot(page, "job-failed")


# ----------------------------------------------------------------------------- the registry pages on the real stack


def _upload_outcome(page: Any) -> tuple[Any, Any]:
    """The upload form's progress text and outcome box."""
    return page.get_by_test_id("upload-progress"), page.get_by_test_id("upload-result")


def _delete_row(page: Any, row: Any) -> None:
    """Click the row's delete button and accept the confirmation."""
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_test_id("delete").click()


def test_upload_a_dataset_from_its_page_see_a_bad_files_line_offer_it_in_the_form_and_delete_it(
    page: Any, embedded_stack: Stack, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    good = tmp_path / "greetings.jsonl"
    good.write_text("".join(json.dumps({"text": f"hello number {i}"}) + "\n" for i in range(7)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": "b"}\n{"txt": "c"}\n')
    page.get_by_test_id("nav-datasets").click()
    form = page.get_by_test_id("dataset-upload")
    progress, outcome = _upload_outcome(page)
    form.get_by_test_id("dataset-format").select_option("text")

    form.get_by_test_id("dataset-file").set_input_files(str(bad))
    form.get_by_test_id("upload").click()
    expect(outcome).to_contain_text("The server refused it (HTTP 422); nothing was stored")
    expect(outcome.get_by_test_id("upload-error")).to_have_text(
        "line 3: field text: missing"
    )  # the API's message, whole
    _shot(page, "dataset-422")

    form.get_by_test_id("dataset-file").set_input_files(str(good))
    form.get_by_test_id("upload").click()
    expect(outcome).to_contain_text('Uploaded dataset "greetings.jsonl": 7 rows of text')
    expect(progress).to_contain_text(f"100% · {good.stat().st_size} B of {good.stat().st_size} B sent")
    expect(form.get_by_test_id("upload-bar")).to_have_js_property("value", 100)
    [stored] = [d for d in embedded_stack.client.get("/datasets").json()["datasets"] if d["name"] == "greetings.jsonl"]
    assert (stored["rows"], stored["sha256"]) == (7, hashlib.sha256(good.read_bytes()).hexdigest())
    assert not [d for d in embedded_stack.client.get("/datasets").json()["datasets"] if d["name"] == "bad.jsonl"]
    row = page.locator(f"[data-testid=dataset-row][data-id='{stored['id']}']")
    expect(row.locator("[data-column=rows]")).to_have_text("7")
    expect(row.locator("[data-column=format]")).to_have_text("text (jsonl)")
    expect(row.locator("[data-column=sha256]")).to_have_text(stored["sha256"][:12])
    _shot(page, "datasets")

    # the submit form offers it by name and puts its id in the spec, the rest of the text as written
    page.get_by_test_id("nav-submit").click()
    picker = page.get_by_test_id("pick-dataset")
    expect(picker.locator("option", has_text="greetings.jsonl (text, 7 rows")).to_have_count(1)
    picker.select_option(stored["id"])
    page.get_by_test_id("use-dataset").click()
    text = page.get_by_test_id("spec").input_value()
    spec = yaml.safe_load(text)
    assert spec["dataset"] == {"name": "jsonl", "config": {"dataset_id": stored["id"]}}
    assert spec["model"]["name"] == "mlp" and text.startswith("# A short fp16 run")  # the comment stays
    _shot(page, "submit-registered")

    page.get_by_test_id("nav-datasets").click()
    _delete_row(page, row)
    expect(row).to_have_count(0)
    assert embedded_stack.client.get(f"/datasets/{stored['id']}").status_code == 404


def test_upload_a_model_as_a_tar_and_as_a_directory_offer_it_in_the_form_and_delete_it(
    page: Any, embedded_stack: Stack, tmp_path: Path
) -> None:
    """A tiny Llama uploaded twice from the Models page: as a tar made here, and as its directory (the page packs it);
    both store the same files (one SHA-256)."""
    from playwright.sync_api import expect

    from tests.trainer.hf_support import save_tiny_llama

    directory = tmp_path / "tiny-llama"
    save_tiny_llama(directory)
    files = sorted(directory.iterdir())
    archive = tmp_path / "tiny-llama.tar"
    with tarfile.open(archive, "w") as tar:  # uncompressed
        for file in files:
            tar.add(file, arcname=file.name)
    page.get_by_test_id("nav-models").click()
    form = page.get_by_test_id("model-upload")
    progress, outcome = _upload_outcome(page)

    form.get_by_test_id("model-file").set_input_files(str(archive))
    expect(form.get_by_test_id("model-chosen")).to_contain_text("tiny-llama.tar")
    form.get_by_test_id("upload").click()
    expect(outcome).to_contain_text(f'Uploaded model "tiny-llama": llama, {len(files)} files')
    expect(progress).to_contain_text("100%")

    form.get_by_test_id("model-dir").set_input_files(str(directory))
    expect(form.get_by_test_id("model-chosen")).to_contain_text(f"tiny-llama/: {len(files)} files")
    form.get_by_test_id("upload-name").fill("tiny-llama-dir")
    form.get_by_test_id("upload").click()
    expect(outcome).to_contain_text(f'Uploaded model "tiny-llama-dir": llama, {len(files)} files')
    expect(progress).to_contain_text("100%")
    models = {m["name"]: m for m in embedded_stack.client.get("/models").json()["models"]}
    assert models["tiny-llama"]["sha256"] == models["tiny-llama-dir"]["sha256"]  # the same files, byte for byte
    assert models["tiny-llama"]["bytes"] == sum(file.stat().st_size for file in files)
    rows = [
        page.locator(f"[data-testid=model-row][data-id='{models[name]['id']}']")
        for name in ("tiny-llama", "tiny-llama-dir")
    ]
    for row in rows:
        expect(row.locator("[data-column=model_type]")).to_have_text("llama")
        expect(row.locator("[data-column=files]")).to_have_text(str(len(files)))
        expect(row.locator("[data-column=source]")).to_have_text("upload")
    _shot(page, "models")

    page.get_by_test_id("nav-submit").click()
    picker = page.get_by_test_id("pick-model")
    expect(picker.locator("option", has_text="tiny-llama-dir (llama")).to_have_count(1)
    picker.select_option(models["tiny-llama-dir"]["id"])
    page.get_by_test_id("use-model").click()
    spec = yaml.safe_load(page.get_by_test_id("spec").input_value())
    assert spec["model"] == {"name": "hf", "config": {"model_id": models["tiny-llama-dir"]["id"]}}

    page.get_by_test_id("nav-models").click()
    for row in rows:
        _delete_row(page, row)
        expect(row).to_have_count(0)
    assert all(
        embedded_stack.client.get(f"/models/{models[n]['id']}").status_code == 404
        for n in ("tiny-llama", "tiny-llama-dir")
    )


# ----------------------------------------------------------------------------- the submit form's marks, no stack

#: The origin the static-only pages load from; Playwright answers every request to it (:meth:`StaticSite.serve`).
STATIC_ORIGIN = "http://halfcast.test"
#: A spec with a misspelt field inside the ``mlp`` member of the model union (line 5), in YAML.
NESTED_SPEC = """\
name: nested
model:
  name: mlp
  config:
    hiden_sizes: [8]
dataset:
  name: synthetic
  config: {task: regression, num_samples: 64}
optimizer:
  name: adamw
  betas: [0.9, 2]
faults:
  nonfinite_grad_steps:
    - 3
    - 0
max_steps: 10
"""


def _rejection(spec: Any) -> list[dict[str, Any]]:
    """The 422 ``detail`` ``POST /jobs`` answers for ``spec``: JobSpec's errors at ``body``, with ``field``.

    As server/http/body_errors.py builds it.
    """
    try:
        JobSpec.model_validate(spec)
    except ValidationError as exc:
        items = [{**item, "loc": ["body", *item["loc"]]} for item in jsonable_encoder(exc.errors(include_url=False))]
        return [with_field(item, JobSpec.__pydantic_core_schema__) for item in items]
    raise AssertionError("the spec is valid")


@dataclass
class StaticSite:
    """A page of the dashboard's static files alone, with canned API answers (no stack)."""

    page: Any
    #: GET path -> the JSON it answers (the job resource, its metrics...), or the text of an event stream;
    #: any other API path is a 404. The registry's lists start empty.
    answers: dict[str, Any] = field(
        default_factory=lambda: {
            "/datasets": {"datasets": [], "next_cursor": None},
            "/models": {"models": [], "next_cursor": None},
        }
    )
    #: (method, path) -> (status, JSON body) for requests other than a GET (an upload, a deletion).
    replies: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    #: Every API request but a GET: method, path, query, headers and body.
    requests: list[dict[str, Any]] = field(default_factory=list)

    def serve(self, route: Any) -> None:
        """Static files from the package; ``replies``; ``POST /jobs`` a 422 for its body (:func:`_rejection`); ``answers``;
        ``/`` a blank page."""
        url = urlsplit(route.request.url)
        method = route.request.method
        if method != "GET":
            self.requests.append(
                {
                    "method": method,
                    "path": url.path,
                    "query": parse_qs(url.query),
                    "headers": route.request.headers,
                    "body": route.request.post_data_buffer,
                }
            )
        if (reply := self.replies.get((method, url.path))) is not None:
            status, body = reply
            route.fulfill(
                status=status, body=b"" if body is None else json.dumps(body), content_type="application/json"
            )
        elif url.path.startswith("/static/"):
            file = static_dir() / url.path.removeprefix("/static/")
            content_type = (
                "text/javascript" if file.suffix == ".js" else mimetypes.guess_type(file.name)[0] or "text/plain"
            )
            route.fulfill(status=200, body=file.read_bytes(), content_type=content_type)
        elif url.path == "/jobs" and route.request.method == "POST":
            body = {"detail": _rejection(json.loads(route.request.post_data))}
            route.fulfill(status=422, body=json.dumps(body), content_type="application/json")
        elif url.path == "/":
            page = '<!doctype html><link rel="stylesheet" href="/static/vendor/uplot/uPlot.min.css">'
            page += '<link rel="stylesheet" href="/static/style.css"><main id="view"></main>'
            page += '<script src="/static/vendor/uplot/uPlot.iife.min.js"></script>'
            page += '<script src="/static/vendor/js-yaml/js-yaml.min.js"></script>'
            route.fulfill(status=200, body=page, content_type="text/html")
        elif isinstance(answer := self.answers.get(url.path), str):  # an event stream's text
            route.fulfill(status=200, body=answer, content_type="text/event-stream")
        elif url.path in self.answers:
            route.fulfill(status=200, body=json.dumps(answer), content_type="application/json")
        else:
            route.fulfill(status=404, body=json.dumps({"detail": "not here"}), content_type="application/json")


@pytest.fixture
def site(browser: Any) -> Iterator[StaticSite]:
    """A :class:`StaticSite` at ``/`` (uPlot and js-yaml loaded); no console errors allowed."""
    context = browser.new_context(viewport={"width": 900, "height": 900}, base_url=STATIC_ORIGIN)
    site = StaticSite(context.new_page())
    context.route(f"{STATIC_ORIGIN}/**", site.serve)
    errors: list[str] = []
    site.page.on("pageerror", lambda error: errors.append(str(error)))
    site.page.on("console", lambda message: errors.append(message.text) if _unexpected(message) else None)
    site.page.set_default_timeout(30_000)
    site.page.goto("/")
    yield site
    context.close()
    assert errors == [], errors


def _marks(page: Any, text: str, detail: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``errorMarks(text, detail)`` of submit.js, run in the page."""
    script = "async ([text, detail]) => (await import('/static/submit.js')).errorMarks(text, detail)"
    marks: list[dict[str, Any]] = page.evaluate(script, [text, detail])
    return marks


def _line(text: str, start: str) -> int:
    """The 0-based index of the first line of ``text`` that starts with ``start``."""
    return next(i for i, line in enumerate(text.split("\n")) if line.startswith(start))


def test_marks_land_on_the_deepest_written_key_of_the_field_without_union_tags(site: StaticSite) -> None:
    detail = _rejection(yaml.safe_load(NESTED_SPEC))
    marks = {mark["path"]: mark["line"] for mark in _marks(site.page, NESTED_SPEC, detail)}
    assert marks == {
        "model.config.hiden_sizes": _line(NESTED_SPEC, "    hiden_sizes"),
        "optimizer.betas[1]": _line(NESTED_SPEC, "  betas"),
        "faults.nonfinite_grad_steps[1]": _line(NESTED_SPEC, "    - 0"),
    }


def test_marks_follow_nested_mappings_lists_and_json_text(site: StaticSite) -> None:
    def item(*field: str | int) -> dict[str, Any]:
        return {"loc": ["body", *field], "field": list(field), "msg": "m"}

    detail = [
        item("model", "config", "lr"),
        item("dataset", "config", "num_samples"),
        item("faults", "nonfinite_grad_steps", 0),
        item("bogus"),
        item(),
        {"loc": ["body", "max_steps"], "msg": "no field: an older server"},
    ]
    lines = [mark["line"] for mark in _marks(site.page, NESTED_SPEC, detail)]
    # model.config has no lr: its config line, not the optimizer's (a later section) nor the model's
    assert lines == [
        _line(NESTED_SPEC, "  config:"),
        _line(NESTED_SPEC, "  config: {"),
        _line(NESTED_SPEC, "    - 3"),
        -1,
        -1,
        _line(NESTED_SPEC, "max_steps"),
    ]
    as_json = json.dumps(yaml.safe_load(NESTED_SPEC), indent=2)
    [mark] = _marks(site.page, as_json, [item("model", "config", "hiden_sizes")])
    assert as_json.split("\n")[mark["line"]].strip().startswith('"hiden_sizes"')


def test_the_form_marks_a_nested_field_on_its_line_with_its_whole_message(site: StaticSite) -> None:
    from playwright.sync_api import expect

    site.page.evaluate("async () => (await import('/static/submit.js')).submitPage(document.getElementById('view'))")
    site.page.get_by_test_id("spec").fill(NESTED_SPEC)
    site.page.get_by_test_id("submit").click()
    expect(site.page.get_by_test_id("errors").locator("li")).to_have_count(3)
    line = _line(NESTED_SPEC, "    hiden_sizes") + 1
    mark = site.page.locator(f".gutter .mark[data-line='{line}']")
    message = "model.config.hiden_sizes: Extra inputs are not permitted"
    expect(mark).to_have_text(f"◀ {message}")  # no "mlp" union tag in the path
    note = mark.locator(".note")
    width, full, height = note.evaluate("n => [n.clientWidth, n.scrollWidth, n.getBoundingClientRect().height]")
    assert full <= width and height > 20, "the note is cut off instead of wrapped"
    expect(site.page.get_by_test_id("errors")).to_contain_text(
        f"model.config.hiden_sizes (line {line}): Extra inputs are not permitted"
    )
    _shot(site.page, "submit-nested-422")


# ----------------------------------------------------------------------------- the job page and list, no stack

#: When the canned jobs were created, started and ended.
AT = "2026-12-02T10:00:00Z"


def _records(steps: int, scale: float) -> list[dict[str, Any]]:
    """Step records 1..``steps`` with loss scale ``scale``."""
    return [
        {
            "step": step,
            "time": 1000.0 + step,
            "loss": 1.0 / step,
            "loss_scale": scale,
            "skipped_steps": 0,
            "samples_per_second": 100.0,
        }
        for step in range(1, steps + 1)
    ]


def _resource(job_id: str, **fields: Any) -> dict[str, Any]:
    """A succeeded fp16 job of 6 steps as ``GET /jobs/{id}`` answers it, with ``fields``.

    Checked by :class:`server.schemas.JobPublic`.
    """
    resource = {
        "id": job_id,
        "name": job_id,
        "status": "succeeded",
        "spec": {"precision": "fp16"},
        "created_at": AT,
        "started_at": AT,
        "finished_at": AT,
        "error": None,
        "step": 6,
        "max_steps": 6,
        "world_size": 1,
        "latest": None,
        "eval": None,
        "attempt": 1,
        "loss_scaling": "dynamic",
    } | fields
    return JobPublic.model_validate(resource).model_dump(mode="json")


def _serve_job(site: StaticSite, job: dict[str, Any], scale: float) -> None:
    """Answer ``job``'s resource, metrics (records at ``scale``), evaluations, checkpoints, exports and a one-event stream."""
    base = f"/jobs/{job['id']}"
    site.answers.update(
        {
            base: job,
            f"{base}/metrics": {"job_id": job["id"], "points": _records(job["step"], scale)},
            f"{base}/evals": {"job_id": job["id"], "evals": []},
            f"{base}/checkpoints": {"checkpoints": []},
            f"{base}/exports": {"exports": []},
            f"{base}/events": f"event: status\ndata: {json.dumps(job)}\n\n",
        }
    )


def _stat(page: Any, name: str) -> Any:
    """The value of the job page's stat ``name``."""
    return page.locator(f"[data-testid=job-stats] dt:text-is('{name}') + dd")


def test_a_job_that_scales_no_loss_shows_none_and_no_loss_scale_chart(site: StaticSite) -> None:
    from playwright.sync_api import expect

    bf16 = _resource("bf16", spec={"precision": "bf16"}, loss_scaling="none", latest=_records(6, 1.0)[-1])
    fp16 = _resource("fp16", latest=_records(6, 65536.0)[-1])
    for job, scale in ((bf16, 1.0), (fp16, 65536.0)):
        _serve_job(site, job, scale)
    site.answers["/jobs"] = {"jobs": [bf16, fp16], "next_cursor": None}
    site.page.evaluate("async () => (await import('/static/jobs.js')).jobList(document.getElementById('view'))")
    for job_id, shown in (("bf16", "none"), ("fp16", "65536 (2^16)")):
        expect(site.page.locator(f"[data-job-id='{job_id}'] td").nth(4)).to_have_text(shown)  # the Loss scale column
    site.page.evaluate("async () => (await import('/static/jobs.js')).jobPage(document.getElementById('view'), 'bf16')")
    expect(site.page.get_by_test_id("chart-loss")).to_have_attribute("data-points", "6")
    expect(site.page.get_by_test_id("chart-scale")).to_have_count(0)  # a flat "2^0" line says nothing
    expect(_stat(site.page, "Loss scale")).to_have_text("none")
    _shot(site.page, "job-bf16")
    site.page.evaluate("async () => (await import('/static/jobs.js')).jobPage(document.getElementById('view'), 'fp16')")
    expect(site.page.get_by_test_id("chart-scale")).to_have_attribute("data-points", "6")
    expect(_stat(site.page, "Loss scale")).to_have_text("65536 (2^16)")


def test_a_resumed_jobs_page_lists_every_attempt_with_its_requeue(site: StaticSite) -> None:
    from playwright.sync_api import expect

    def attempt(number: int, status: str | None, reason: str | None, resumed: int | None) -> dict[str, Any]:
        return {
            "attempt": number,
            "worker_id": f"host/{number}",
            "started_at": AT,
            "ended_at": AT if status else None,
            "status": status,
            "reason": reason,
            "resumed_from_step": resumed,
        }

    attempts = [
        attempt(1, "requeued", "worker_shutdown", None),
        attempt(2, "failed", "worker_lost", 4),
        attempt(3, None, None, 0),
    ]
    job = _resource("resumed", status="running", step=2, max_steps=20, attempt=3, attempts=attempts)
    _serve_job(site, job, 65536.0)
    site.page.evaluate(
        "async () => (await import('/static/jobs.js')).jobPage(document.getElementById('view'), 'resumed')"
    )
    rows = site.page.get_by_test_id("attempt")
    expect(rows).to_have_count(3)
    shown = [
        [cells[i] for i in (0, 1, 2, 3, 6)] for cells in (rows.nth(i).locator("td").all_inner_texts() for i in range(3))
    ]
    assert shown == [
        ["1", "requeued", "worker_shutdown", "host/1", "-"],
        ["2", "failed", "worker_lost", "host/2", "step 4"],
        ["3", "in progress", "-", "host/3", "the start"],
    ]
    _shot(site.page, "job-attempts")


def test_a_fine_tuned_jobs_page_links_its_exports_as_tar_downloads(site: StaticSite) -> None:
    """An hf LoRA job's page lists ``export/adapter`` and ``export/model`` (the API's ``ExportList``) as
    tar downloads; a job without exports shows no Exports box."""
    from playwright.sync_api import expect

    from server.routes.exports import ExportList

    def export(kind: str, files: dict[str, int]) -> dict[str, Any]:
        return {
            "kind": kind,
            "attempt": 2,
            "files": [{"name": n, "size_bytes": b} for n, b in files.items()],
            "size_bytes": sum(files.values()),
            "modified_at": AT,
            "url": f"/jobs/lora/exports/{kind}?attempt=2",
        }

    exports = ExportList.model_validate(
        {
            "job_id": "lora",
            "exports": [
                export("adapter", {"adapter_config.json": 800, "adapter_model.safetensors": 40_000}),
                export("model", {"config.json": 700, "model.safetensors": 3_000_000, "tokenizer.json": 5_000}),
            ],
        }
    )
    job = _resource("lora", spec={"precision": "bf16"}, loss_scaling="none")
    _serve_job(site, job, 1.0)
    site.answers["/jobs/lora/exports"] = exports.model_dump(mode="json")
    site.page.evaluate("async () => (await import('/static/jobs.js')).jobPage(document.getElementById('view'), 'lora')")
    links = site.page.get_by_test_id("export")
    expect(links).to_have_count(2)
    expect(links.nth(0)).to_contain_text("adapter.tar attempt 2, 2 files")
    expect(links.nth(1).locator("a")).to_have_attribute("href", "/jobs/lora/exports/model?attempt=2")
    expect(links.nth(1).locator("a")).to_have_attribute("download", "lora-model.tar")
    _shot(site.page, "job-exports")
    _serve_job(site, _resource("plain"), 65536.0)
    site.page.evaluate(
        "async () => (await import('/static/jobs.js')).jobPage(document.getElementById('view'), 'plain')"
    )
    expect(site.page.get_by_test_id("chart-loss")).to_have_attribute("data-points", "6")
    expect(site.page.get_by_test_id("exports")).to_be_hidden()


# ----------------------------------------------------------------------------- the registry pages, no stack

#: Files of a model directory as ``webkitdirectory`` gives them: (path under the chosen directory, content).
DIRECTORY = [
    ("model/config.json", '{"model_type": "llama"}'), ("model/empty.txt", ""), ("model/one-block.bin.txt", "x" * 512),
    ("model/over-a-block", "y" * 513), ("model/" + "d" * 120 + "/" + "f" * 90 + ".json", "split between prefix and name"),
    ("model/" + "/".join(["n" * 60] * 5) + "/deep.txt", "a pax path"), ("model/токенизатор.json", "not ASCII"),
]  # fmt: skip  # a table, laid out by hand
#: Builds the ``DIRECTORY`` files (each with its ``webkitRelativePath``) and packs them with tar.js; the tar's bytes.
PACK_DIRECTORY = """async (directory) => {
  const { directoryEntries, tarBlob } = await import('/static/tar.js');
  const files = directory.map(([path, content]) => {
    const file = new File([content], path.split('/').pop(), { lastModified: 1700000000123 });
    Object.defineProperty(file, 'webkitRelativePath', { value: path });
    return file;
  });
  return Array.from(new Uint8Array(await tarBlob(directoryEntries(files.reverse())).arrayBuffer()));
}"""


def test_a_chosen_directory_is_packed_into_a_tar_that_tarfile_and_the_registry_read(
    site: StaticSite, tmp_path: Path
) -> None:
    """tar.js's ustar: names split between prefix and name, pax paths for long or non-ASCII ones, sizes at and over
    a block; Python's tarfile reads it (checksums included) and the registry's archive check extracts it."""
    from server.registry.model_archive import extract_model_archive

    packed = bytes(site.page.evaluate(PACK_DIRECTORY, [list(item) for item in DIRECTORY]))
    assert len(packed) % 512 == 0 and packed.endswith(bytes(1024))
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == sorted(path for path, _ in DIRECTORY)  # in name order
        assert all(m.isreg() and m.mode == 0o644 and m.mtime == 1_700_000_000 for m in members)
        assert {m.name: _member_text(tar, m) for m in members} == dict(DIRECTORY)
    archive = tmp_path / "model.tar"
    archive.write_bytes(packed)
    extract_model_archive(archive, tmp_path / "extracted")  # the top directory is dropped
    assert (tmp_path / "extracted" / "config.json").read_text() == '{"model_type": "llama"}'
    assert (tmp_path / "extracted" / "токенизатор.json").read_text() == "not ASCII"

    # a file of 8 GiB or more: its size in a pax record (11 octal digits stop at 8 GiB - 1)
    script = (
        "async (size) => (await import('/static/tar.js'))"
        ".entryHeaders('model/huge.safetensors', size, 1700000000).flatMap((b) => Array.from(b))"
    )
    headers = bytes(site.page.evaluate(script, 2**33 + 5))
    with tarfile.open(fileobj=io.BytesIO(headers), mode="r:") as tar:
        huge = tar.next()  # the first member
        assert huge is not None and (huge.name, huge.size, huge.mtime) == (
            "model/huge.safetensors",
            2**33 + 5,
            1_700_000_000,
        )


#: A spec written by hand: comments, a jsonl dataset under a data root, an hf model under a model root.
HAND_WRITTEN = """\
# fine-tune on my chats
name: by-hand
model:
  name: hf
  config: {path: llama/base, tokenizer_path: llama/tok, task: sequence_classification, num_labels: 3}
dataset:
  name: jsonl  # from the data root
  config:
    path: chats/train.jsonl
    format: chat
    column_map: {prompt: instruction}
    max_seq_len: 128

# the optimizer's settings
optimizer: {name: adamw, lr: 0.001}
"""


def _set_field(page: Any, text: str, field: str, registered_id: str, json_text: bool = False) -> str:
    """spec_edit.js's setField of ``text`` with ``field`` set to the registered ``registered_id`` (datasetWith / modelWith)."""
    script = """async ([text, field, id, json]) => {
      const edit = await import('/static/spec_edit.js');
      const spec = json ? JSON.parse(text) : jsyaml.load(text);
      const value = field === 'dataset' ? edit.datasetWith(spec.dataset, id) : edit.modelWith(spec.model, id);
      return edit.setField(text, spec, field, value, json);
    }"""
    result: str = page.evaluate(script, [text, field, registered_id, json_text])
    return result


def test_using_a_registered_input_replaces_only_that_field_of_the_spec(site: StaticSite) -> None:
    with_dataset = _set_field(site.page, HAND_WRITTEN, "dataset", "d-1")
    # the dataset's block only: the source fields go (format defaults to the dataset's), max_seq_len stays, comments stay
    assert with_dataset == HAND_WRITTEN.replace(
        "  name: jsonl  # from the data root\n  config:\n    path: chats/train.jsonl\n    format: chat\n"
        "    column_map: {prompt: instruction}\n    max_seq_len: 128\n",
        "  name: jsonl\n  config:\n    dataset_id: d-1\n    max_seq_len: 128\n",
    )
    with_both = yaml.safe_load(_set_field(site.page, with_dataset, "model", "m-1"))
    assert with_both["model"] == {
        "name": "hf",
        "config": {"model_id": "m-1", "task": "sequence_classification", "num_labels": 3},
    }
    assert with_both["optimizer"] == {"name": "adamw", "lr": 0.001}
    # another kind of dataset or model is replaced whole; a spec without one gets it appended
    assert yaml.safe_load(
        _set_field(site.page, "model: {name: mlp, config: {hidden_sizes: [8]}}\n", "model", "m-2")
    ) == {"model": {"name": "hf", "config": {"model_id": "m-2"}}}
    assert (
        _set_field(site.page, "name: x\n\n\n", "dataset", "d-2")
        == "name: x\ndataset:\n  name: jsonl\n  config:\n    dataset_id: d-2\n"
    )
    # JSON is written out again; so is YAML whose top-level keys are not plain block keys
    spec = {"name": "j", "dataset": {"name": "synthetic", "config": {}}, "max_steps": 3}
    assert json.loads(_set_field(site.page, json.dumps(spec), "dataset", "d-3", json_text=True)) == {
        **spec,
        "dataset": {"name": "jsonl", "config": {"dataset_id": "d-3"}},
    }
    assert yaml.safe_load(_set_field(site.page, '"name": q\nmax_steps: 3\n', "dataset", "d-4")) == {
        "name": "q",
        "max_steps": 3,
        "dataset": {"name": "jsonl", "config": {"dataset_id": "d-4"}},
    }


def _registered(kind: str, item_id: str, **fields: Any) -> dict[str, Any]:
    """A dataset or model as ``GET /datasets`` or ``GET /models`` lists it (checked by its schema)."""
    from server.registry.schemas import DatasetPublic, ModelPublic

    if kind == "dataset":
        base = {"format": "classification", "file_format": "csv", "rows": 1234, "bytes": 1_572_864}
        schema: Any = DatasetPublic
    else:
        base = {"model_type": "bert", "files": 6, "bytes": 9_000_000, "source_job_id": None}
        schema = ModelPublic
    item = {
        "id": item_id,
        "name": f"my-{kind}",
        "owner": "alice",
        "sha256": "abcdef0123456789" * 4,
        "created_at": AT,
        **base,
    } | fields
    return schema.model_validate(item).model_dump(mode="json")


def _upload_requests(site: StaticSite, path: str) -> list[dict[str, Any]]:
    return [request for request in site.requests if (request["method"], request["path"]) == ("POST", path)]


def test_the_datasets_page_sends_the_type_its_extension_names_and_shows_each_refusal_whole(site: StaticSite) -> None:
    from playwright.sync_api import expect

    from halfcast.core.db.registry import RegisteredInUse
    from server.registry.request_checks import unsupported_media_type

    dataset = _registered("dataset", "ds-1")
    site.answers["/datasets"] = {"datasets": [dataset], "next_cursor": None}
    quota = "quota exceeded: max_storage_bytes is 1000000 for owner alice (1572864 in use)"
    site.replies[("POST", "/datasets")] = (429, {"detail": quota, "limit": "max_storage_bytes", "value": 1_000_000})
    in_use = str(RegisteredInUse("dataset", "ds-1", ["job-a", "job-b"]))
    site.replies[("DELETE", "/datasets/ds-1")] = (409, {"detail": in_use})
    page = site.page
    page.evaluate("sessionStorage.setItem('halfcast-token', 'hc_static')")
    page.evaluate("async () => (await import('/static/registry.js')).datasetsPage(document.getElementById('view'))")
    row = page.locator("[data-testid=dataset-row][data-id='ds-1']")
    assert [row.locator(f"[data-column={c}]").inner_text() for c in ("format", "rows", "bytes", "sha256", "owner")] == [
        "classification (csv)",
        "1234",
        "1.5 MiB",
        "abcdef012345",
        "alice",
    ]

    form = page.get_by_test_id("dataset-upload")
    progress, outcome = _upload_outcome(page)
    csv = b"text,label\nhello,0\nbye,1\n"
    form.get_by_test_id("dataset-file").set_input_files(
        files=[{"name": "rows.csv", "mimeType": "text/plain", "buffer": csv}]
    )
    form.get_by_test_id("upload").click()  # no format chosen: the browser asks for one, nothing is sent
    page.wait_for_timeout(200)
    assert not _upload_requests(site, "/datasets")
    form.get_by_test_id("dataset-format").select_option("classification")
    form.get_by_test_id("upload").click()
    expect(outcome).to_contain_text("The server refused it (HTTP 429); nothing was stored")
    expect(outcome.get_by_test_id("upload-error")).to_have_text(quota)
    [sent] = _upload_requests(site, "/datasets")
    assert (sent["headers"]["content-type"], sent["query"], sent["body"]) == (
        "text/csv",
        {"format": ["classification"], "name": ["rows.csv"]},
        csv,
    )
    assert sent["headers"]["authorization"] == "Bearer hc_static"  # api.js's token, on the XMLHttpRequest too
    expect(progress).to_contain_text(f"of {len(csv)} B")  # (Playwright's routing sends no upload progress events)
    _shot(page, "dataset-429")

    # the type comes from the extension (.json is JSON lines), or from the choice; an unknown one is not sent
    site.replies[("POST", "/datasets")] = (
        415,
        {"detail": unsupported_media_type("", ["application/jsonl", "text/csv"]).body.detail},
    )
    form.get_by_test_id("dataset-file").set_input_files(
        files=[{"name": "rows.json", "mimeType": "", "buffer": b'{"text": 1}\n'}]
    )
    form.get_by_test_id("upload-name").fill("named here")
    form.get_by_test_id("upload").click()
    expect(outcome.get_by_test_id("upload-error")).to_have_text(
        "Content-Type must be one of application/jsonl, text/csv (got none)"
    )
    assert _upload_requests(site, "/datasets")[-1]["headers"]["content-type"] == "application/jsonl"
    assert _upload_requests(site, "/datasets")[-1]["query"]["name"] == ["named here"]
    form.get_by_test_id("dataset-file").set_input_files(
        files=[{"name": "rows.txt", "mimeType": "text/plain", "buffer": csv}]
    )
    form.get_by_test_id("upload").click()
    expect(outcome.get_by_test_id("upload-error")).to_have_text(
        "cannot tell the file format of rows.txt: name it .jsonl, .json or .csv, or choose its file type"
    )
    assert len(_upload_requests(site, "/datasets")) == 2
    form.get_by_test_id("dataset-file-type").select_option("csv")
    form.get_by_test_id("upload").click()
    expect(page.get_by_test_id("upload-result")).to_contain_text("HTTP 415")
    assert _upload_requests(site, "/datasets")[-1]["headers"]["content-type"] == "text/csv"

    # deleting asks first; a dataset in use is a 409 naming its jobs, each a link
    page.once("dialog", lambda dialog: dialog.dismiss())
    row.get_by_test_id("delete").click()
    page.wait_for_timeout(200)
    assert not [r for r in site.requests if r["method"] == "DELETE"]
    _delete_row(page, row)
    problem = page.get_by_test_id("registry-error")
    expect(problem).to_contain_text(f"Not deleted (HTTP 409): {in_use}")
    assert [a.get_attribute("href") for a in problem.get_by_test_id("using-job").all()] == [
        "#/jobs/job-a",
        "#/jobs/job-b",
    ]
    expect(row).to_be_visible()
    _shot(page, "dataset-409")


def test_the_models_page_sends_a_chosen_tar_as_it_is_and_shows_a_refusal_whole(site: StaticSite) -> None:
    from playwright.sync_api import expect

    from server.registry.upload import too_large

    site.answers["/models"] = {"models": [_registered("model", "m-1", source_job_id="job-9")], "next_cursor": None}
    refused = "entry 'pytorch_model.bin': pickle files are refused (use *.safetensors weights)"
    site.replies[("POST", "/models")] = (
        422,
        {"detail": [{"type": "value_error", "loc": ["body", "pytorch_model.bin"], "msg": refused, "input": None}]},
    )
    page = site.page
    page.evaluate("async () => (await import('/static/registry.js')).modelsPage(document.getElementById('view'))")
    row = page.locator("[data-testid=model-row][data-id='m-1']")
    expect(row.locator("[data-column=source] a")).to_have_attribute("href", "#/jobs/job-9")
    expect(row.locator("[data-column=model_type]")).to_have_text("bert")

    form = page.get_by_test_id("model-upload")
    _, outcome = _upload_outcome(page)
    form.get_by_test_id("upload").click()
    expect(outcome.get_by_test_id("upload-error")).to_have_text("choose a model directory or a tar archive of one")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("pytorch_model.bin")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    form.get_by_test_id("model-file").set_input_files(
        files=[{"name": "weights.tar", "mimeType": "", "buffer": archive.getvalue()}]
    )
    form.get_by_test_id("upload").click()
    expect(outcome).to_contain_text("The server refused it (HTTP 422); nothing was stored")
    expect(outcome.get_by_test_id("upload-error")).to_have_text(refused)
    [sent] = _upload_requests(site, "/models")
    assert (sent["headers"]["content-type"], sent["query"], sent["body"]) == (
        "application/x-tar",
        {"name": ["weights"]},
        archive.getvalue(),
    )
    too_big = too_large(16).body.detail
    site.replies[("POST", "/models")] = (413, {"detail": too_big})
    form.get_by_test_id("upload").click()
    expect(outcome.get_by_test_id("upload-error")).to_have_text(too_big)
    expect(outcome).to_contain_text("HTTP 413")
    _shot(page, "model-413")
