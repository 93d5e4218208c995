"""The reference model's first download and its cache, as a new validator or miner meets them: the
real loading code (quasar.logits.load_reference_model, in a process of its own as at a start) gets
a tiny random Qwen2 from a Hugging Face Hub stand-in on 127.0.0.1 (tests/hub_standin.py) through
huggingface_hub. A download that breaks off, a full or unwritable cache, the hub's refusals and
faults each end the start with one sentence naming the model, the folder or the hub, and the cure,
and the next start with the fault gone loads the model; a host whose only way out is an HTTP proxy
downloads through it; one that reaches the hub but not Xet's storage is told to open the way to it
or to set HF_HUB_DISABLE_XET=1, which downloads the weights (docs/validator.md, "The reference model")."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from forward_proxy import ForwardProxy
from hub_standin import HubStandIn
from quasar.hub_model import XET_BOUNDS, bound_xet, hub_proxy, hub_reachable
from servers import accept_connections
from small_disk import SmallDisk, unavailable
from tests.processes import AS_NOBODY, needs_another_user
from tiny_qwen import TINY_VOCAB, make_tiny_qwen2

NAME = "Qwen/Qwen2.5-0.5B-Instruct"
# What a validator's or an inference server's start does with the model and a ModelLoadError (its
# log line, exit status 1); anything else escapes as a traceback.
LOADER = """
import sys
from quasar.errors import QuasarError
from quasar.logits import load_reference_model
try:
    model = load_reference_model(sys.argv[1])
except QuasarError as error:
    print("ERROR", error)
    sys.exit(1)
print("LOADED", model.vocab_size)
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_qwen2(tmp_path_factory.mktemp("hub") / "qwen", seed=1)


@pytest.fixture
def hub(model_dir):
    with HubStandIn({NAME: model_dir}) as running:
        yield running


def load(
    hub: HubStandIn,
    home: Path,
    name: str = NAME,
    prefix: tuple[str, ...] = (),
    loader: str = LOADER,
    timeout: float = 120,
    **variables: str,
) -> subprocess.CompletedProcess:
    """Start the loader with HF_HOME=home (and ``variables``) against the stand-in, without this
    machine's proxy settings, for at most ``timeout`` seconds; its stdout holds LOADED or ERROR."""
    env = {k: v for k, v in os.environ.items() if not is_hub_or_proxy_variable(k)}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(home), HF_HUB_DISABLE_PROGRESS_BARS="1")
    env.update(variables)
    return subprocess.run(
        [*prefix, sys.executable, "-c", loader, name], env=env, capture_output=True, text=True, cwd="/", timeout=timeout
    )


def is_hub_or_proxy_variable(name: str) -> bool:
    return name.startswith(("HF_", "TRANSFORMERS_")) or name.lower().endswith("_proxy")


def refused(result: subprocess.CompletedProcess) -> str:
    """The one error line of a start that failed cleanly (no traceback)."""
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert result.stdout.startswith("ERROR "), result.stdout
    return result.stdout


def loaded(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0 and f"LOADED {TINY_VOCAB}" in result.stdout, result.stdout + result.stderr


def leftovers(home: Path) -> list[str]:
    return sorted(p.name for p in home.rglob("*.incomplete"))


def test_a_first_download_is_cached_and_the_next_start_needs_no_network(hub, tmp_path):
    loaded(load(hub, tmp_path / "hf"))
    assert hub.downloads("model.safetensors") == 1 and hub.downloads("config.json") == 1
    hub.requests.clear()
    hub.close()  # no hub at all: the cached snapshot is whole, so nothing is asked
    loaded(load(hub, tmp_path / "hf"))
    assert hub.requests == []


def test_a_download_cut_mid_file_is_said_and_the_next_start_fetches_what_is_missing(hub, tmp_path):
    hub.cut("model.safetensors", 100_000)
    message = refused(load(hub, tmp_path / "hf"))
    assert f"'{NAME}'" in message and f"download from {hub.cdn} broke off" in message  # where the hub redirects
    assert "Start again" in message and leftovers(tmp_path / "hf") == []
    offline = refused(load(hub, tmp_path / "hf", HF_HUB_OFFLINE="1"))
    assert "lacks model.safetensors (a download cut off) and offline mode is on" in offline
    hub.cut("model.safetensors", None)
    loaded(load(hub, tmp_path / "hf"))
    assert hub.downloads("config.json") == 1  # the finished files were kept


def test_a_snapshot_an_earlier_version_left_without_its_weights_is_completed(hub, tmp_path):
    """transformers' own download fetched config.json first and the weights after it: a start cut
    between the two left a snapshot of config.json alone, which every later start read as the
    cached model and refused ('no file named model.safetensors', 'offline mode is on')."""
    loaded(load(hub, tmp_path / "hf"))
    snapshot = next((tmp_path / "hf" / "hub").glob("models--*/snapshots/*"))
    weights = snapshot / "model.safetensors"
    weights.resolve().unlink()  # its blob, then the link to it
    weights.unlink()
    shutil.rmtree(snapshot.parents[1] / "trees")  # as transformers' download left it: no listing
    loaded(load(hub, tmp_path / "hf"))
    assert hub.downloads("model.safetensors") == 2


def test_a_cached_weights_file_cut_short_is_named_with_the_folder_to_remove(hub, tmp_path):
    """A cache copied from another machine by an interrupted rsync, or a write lost in a crash: the
    weights file is short. The start ended with safetensors' traceback ('incomplete metadata')."""
    loaded(load(hub, tmp_path / "hf"))
    weights = next((tmp_path / "hf" / "hub").glob("models--*/snapshots/*/model.safetensors")).resolve()
    weights.write_bytes(weights.read_bytes()[:100_000])
    message = refused(load(hub, tmp_path / "hf"))
    repo = weights.parents[1]
    assert "SafetensorError" in message and f"A file of the cached copy is damaged: remove {repo} and" in message
    shutil.rmtree(repo)  # the cure the message gives
    loaded(load(hub, tmp_path / "hf"))


@pytest.mark.parametrize(
    "status, code, name, expected",
    [
        (401, "GatedRepo", NAME, "a gated model (HTTP 401). Accept its terms"),
        (403, "GatedRepo", NAME, "a gated model (HTTP 403)"),
        (401, "", NAME, "refused the request (HTTP 401): check the token"),
        (403, "", NAME, "refused the request (HTTP 403)"),
        (None, "", "Qwen/Qwen2.5-0.5B-Instruc", "has no model of that name, or not for this token (HTTP 401)"),
        (404, "RepoNotFound", NAME, "has no model of that name, or not for this token (HTTP 404)"),  # with a token
        (429, "", NAME, "is limiting this machine's requests (HTTP 429)"),
        (500, "", NAME, "answered HTTP 500, a fault on its side"),
        (503, "", NAME, "answered HTTP 503, a fault on its side"),
    ],
)
def test_the_hubs_refusals_and_faults_are_named_with_their_cure(hub, tmp_path, status, code, name, expected):
    hub.answer(status, code)
    message = refused(load(hub, tmp_path / "hf", name))
    assert f"'{name}'" in message and f"{hub.endpoint} " in message and expected in message


@needs_another_user
def test_a_cache_this_user_cannot_write_is_named(hub):
    # Root's folder, read by an ordinary user (nobody) who starts the loader with it as HF_HOME.
    home = Path(tempfile.mkdtemp(prefix="quasar-hf-"))
    try:
        home.chmod(0o755)
        message = refused(load(hub, home, prefix=AS_NOBODY))
        assert f"user 65534 cannot write the Hugging Face cache {home / 'hub'}" in message
        assert "set HF_HOME to a folder it owns" in message
    finally:
        shutil.rmtree(home)


@pytest.mark.skipif(bool(unavailable()), reason=f"no small disk here: {unavailable()}")
@pytest.mark.parametrize("on_xet", [False, True])
def test_a_disk_filling_during_the_download_is_named_and_a_start_with_space_recovers(hub, tmp_path, on_xet):
    """On Xet (the Hub's weights today), hf_xet writes the file: its error for a full disk is a
    RuntimeError ending 'No space left on device (os error 28)', which was told as Xet's storage
    failing, with the cure to open the way out to it or to set HF_HUB_DISABLE_XET=1."""
    if on_xet:
        hub.xet_stored(tmp_path / "cas")
    with SmallDisk(tmp_path / "disk", 1) as disk:
        disk.outside("ballast").write_bytes(b"\1" * 700_000)  # leaves less than the 0.56 MB weights
        home = tmp_path / "disk" / "hf"
        message = refused(load(hub, home, prefix=tuple(disk.enter)))
        assert f"the disk of the Hugging Face cache {home / 'hub'} is full" in message
        assert "Free space there" in message and "Xet" not in message and leftovers(disk.outside("hf")) == []
        disk.outside("ballast").unlink()
        loaded(load(hub, home, prefix=tuple(disk.enter)))
    assert hub.downloads("model.safetensors") == (0 if on_xet else 2)  # Xet's: none through the redirect


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_host_whose_only_way_out_is_a_proxy_downloads_through_it(hub, tmp_path):
    """A data centre's host reaches the Hub only through an HTTP proxy (HTTPS_PROXY/HTTP_PROXY),
    which huggingface_hub's client uses. The start probed the hub itself, which such a host cannot
    reach, and refused ('http://hub.invalid:PORT cannot be reached') although the download works."""
    with ForwardProxy({"hub.invalid": "127.0.0.1"}) as proxy:
        endpoint = hub.endpoint.replace("127.0.0.1", "hub.invalid")  # a name only the proxy resolves
        loaded(load(hub, tmp_path / "hf", HF_ENDPOINT=endpoint, HTTP_PROXY=proxy.url, HTTPS_PROXY=proxy.url))
        assert len(proxy.requests) == len(hub.requests) > 0  # every request went through the proxy
        assert ("GET", f"{endpoint}/api/models/{NAME}/revision/main") in proxy.requests
        assert any(url.startswith(f"{hub.cdn}/cdn/") for _, url in proxy.requests)  # the weights' redirect too


def test_a_proxy_that_is_down_is_refused_at_once_naming_it(hub, tmp_path):
    port = closed_port()
    endpoint = hub.endpoint.replace("127.0.0.1", "hub.invalid")
    started = time.monotonic()
    message = refused(load(hub, tmp_path / "hf", HF_ENDPOINT=endpoint, http_proxy=f"http://me:secret@127.0.0.1:{port}"))
    assert time.monotonic() - started < 20  # the loader's imports, and no half minute of retries
    assert f"the proxy http://127.0.0.1:{port} for {endpoint} cannot be reached" in message
    assert "secret" not in message and hub.requests == []


@pytest.mark.parametrize(
    "variables",
    [
        {"HTTPS_PROXY": "http://alice:s3cr/t@127.0.0.1:{port}"},  # a password's '/' or '#' left unescaped
        {"HTTPS_PROXY": "http://alice:s3cr#t@127.0.0.1:{port}"},
        {"HF_ENDPOINT": "http://alice:s3cret@127.0.0.1:{port}"},  # a mirror's password in its URL
    ],
)
def test_the_probe_names_the_proxy_or_hub_without_its_credentials(monkeypatch, variables):
    for name in [name for name in os.environ if is_hub_or_proxy_variable(name)]:
        monkeypatch.delenv(name)
    port = closed_port()
    for name, value in variables.items():
        monkeypatch.setenv(name, value.format(port=port))
    reachable, target = hub_reachable(timeout=2)
    assert not reachable and f"127.0.0.1:{port}" in target
    assert "alice" not in target and "s3cr" not in target


@pytest.mark.parametrize(
    "status, expected",
    [
        (403, "{hub} refused the request (HTTP 403)"),
        (418, "Client error '418 I'm a Teapot' for url 'http://127.0.0.1:"),  # one named by its own first line
    ],
)
def test_a_refusal_names_the_hub_without_the_credentials_of_its_url(hub, tmp_path, status, expected):
    hub.answer(status)
    endpoint = hub.endpoint.replace("://", "://alice:s3cret@")
    message = refused(load(hub, tmp_path / "hf", HF_ENDPOINT=endpoint))
    assert expected.format(hub=hub.endpoint) in message and "s3cret" not in message and "alice" not in message


@pytest.mark.parametrize("variables", [{}, {"HF_HUB_DISABLE_XET": "1"}])
def test_a_host_the_hub_redirects_to_that_cannot_be_reached_is_named(hub, tmp_path, variables):
    """The hub redirects the weights to another host: its CDN, or its HTTP bridge for a file on Xet
    that HF_HUB_DISABLE_XET=1 downloads through. A way out that lets the hub through but not that
    host was told 'the download from' the hub 'broke off ... Start again', which cannot help."""
    dead = f"http://127.0.0.1:{closed_port()}"
    hub.redirect_to(dead)
    if variables:
        hub.xet(f"http://127.0.0.1:{closed_port()}")
    message = refused(load(hub, tmp_path / "hf", **variables))
    assert f"{hub.endpoint} answers, but {dead}, where it redirects the download, cannot be reached" in message
    assert f"Open this host's way out to {dead} and start again" in message


def test_a_host_that_reaches_the_hub_but_not_xets_storage_is_told_which_and_the_cure_works(hub, tmp_path):
    """The hub keeps the weights on Xet: huggingface_hub asks the hub's token route for the CAS server
    to download them from, another host, and hf_xet connects to it. A host whose way out lets the hub
    through but not that server passed the probe, then ended with hf_xet's error and 'Check the
    network to' the hub, the one host that answered. hf_xet retries 3 times (XET_BOUNDS), with
    pauses of up to 3, 9 and 27 s; once is enough to see its error."""
    cas = f"http://127.0.0.1:{closed_port()}"
    hub.xet(cas)
    message = refused(load(hub, tmp_path / "hf", HF_XET_CLIENT_RETRY_MAX_ATTEMPTS="1"))
    assert f"'{NAME}'" in message and f"{hub.endpoint} answers, but the download from Xet's storage {cas}" in message
    assert f"open this host's way out to Xet's storage {cas}, or set HF_HUB_DISABLE_XET=1" in message
    assert "Check the network" not in message and hub.downloads("model.safetensors") == 0
    loaded(load(hub, tmp_path / "hf", HF_HUB_DISABLE_XET="1"))
    weights = f"/cdn/{hub.repos[NAME].sha256['model.safetensors']}"
    assert hub.requests.count(("GET", weights)) == 1  # through the hub's redirect, as before Xet
    assert hub.downloads("config.json") == 1


def test_a_proxy_that_cannot_reach_xets_storage_is_told_as_xets(hub, tmp_path):
    """hf_xet sends its requests through the proxy too; the proxy's 502 is Xet's storage failing."""
    with ForwardProxy({"hub.invalid": "127.0.0.1", "cas.invalid": "127.0.0.1"}) as proxy:
        cas = f"http://cas.invalid:{closed_port()}"  # a name only the proxy resolves; nothing listens there
        hub.xet(cas)
        endpoint = hub.endpoint.replace("127.0.0.1", "hub.invalid")
        variables = {"HF_ENDPOINT": endpoint, "HTTP_PROXY": proxy.url, "HF_XET_CLIENT_RETRY_MAX_ATTEMPTS": "1"}
        message = refused(load(hub, tmp_path / "hf", **variables))
        assert f"{endpoint} answers, but the download from Xet's storage {cas} failed" in message
        assert "502" in message and any(url.startswith(f"{cas}/") for _, url in proxy.requests)


@contextmanager
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A server on 127.0.0.1 that accepts every connection and never answers: its URL, and the
    connections it holds open."""
    held: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        accept_connections(listener, held.append)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
    for connection in held:
        connection.close()


def test_xets_storage_accepting_and_never_answering_fails_the_start_within_the_bound(hub, tmp_path):
    """hf_xet waits 300 s for each read and tries 6 times: a CAS server that accepts the connection and
    never answers held a start more than half an hour. The download now sets hf_xet's bounds where the
    user set none; here shortened (2 tries of 2 s) by the loader, as XET_BOUNDS's own are minutes."""
    shortened = {**XET_BOUNDS, "HF_XET_CLIENT_READ_TIMEOUT": "2s", "HF_XET_CLIENT_RETRY_MAX_ATTEMPTS": "1"}
    loader = f"import quasar.hub_model\nquasar.hub_model.XET_BOUNDS = {shortened!r}\n{LOADER}"
    with silent_server() as (cas, held):
        hub.xet(cas)
        started = time.monotonic()
        message = refused(load(hub, tmp_path / "hf", loader=loader, timeout=90))
        took = time.monotonic() - started
    assert took < 45, took  # the loader's imports (10 s or so), 2 reads of 2 s and a pause of up to 3 s
    assert held  # the silent server was reached: the wait was on it
    assert f"{hub.endpoint} answers, but the download from Xet's storage {cas} failed" in message
    assert f"open this host's way out to Xet's storage {cas}, or set HF_HUB_DISABLE_XET=1" in message


def test_xets_bounds_are_minutes_and_a_value_the_user_set_is_kept(monkeypatch):
    """A read's timeout restarts at each packet that arrives, so a slow link that still delivers is not
    cut; a duration has its unit, without which hf_xet takes its own (300 s)."""
    assert XET_BOUNDS == {
        "HF_XET_CLIENT_READ_TIMEOUT": "20s",
        "HF_XET_CLIENT_CONNECT_TIMEOUT": "10s",
        "HF_XET_CLIENT_RETRY_MAX_ATTEMPTS": "3",
    }
    for name in XET_BOUNDS:
        monkeypatch.setenv(name, "")  # recorded, so that what bound_xet sets is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("HF_XET_CLIENT_READ_TIMEOUT", "1m 30s")
    bound_xet()
    assert os.environ["HF_XET_CLIENT_READ_TIMEOUT"] == "1m 30s"
    assert os.environ["HF_XET_CLIENT_CONNECT_TIMEOUT"] == "10s"
    assert os.environ["HF_XET_CLIENT_RETRY_MAX_ATTEMPTS"] == "3"


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        ("HF_XET_CLIENT_READ_TIMEOUT", "60", "its own 300s. Write it as a duration with its unit, as 60s or 2m"),
        ("HF_XET_CLIENT_CONNECT_TIMEOUT", "", "its own 60s. Write it as a duration with its unit"),
        ("HF_XET_CLIENT_RETRY_MAX_ATTEMPTS", "1.0", "its own 5. Write it as a whole number of retries"),
    ],
)
def test_a_xet_bound_hf_xet_cannot_read_is_refused_before_the_download(hub, tmp_path, variable, value, expected):
    """hf_xet replaces a value it cannot read by its own default, saying so only in its log file: a
    read timeout of '60' (seconds meant) put back the 300 s that held a start half an hour."""
    with silent_server() as (cas, held):
        hub.xet(cas)
        message = refused(load(hub, tmp_path / "hf", timeout=60, **{variable: value}))
    assert f"{variable} is {value!r}, which hf_xet" in message and expected in message
    assert hub.requests == [] and held == []


def test_a_hub_no_proxy_lists_is_probed_and_downloaded_from_directly(hub, tmp_path):
    dead = f"http://127.0.0.1:{closed_port()}"
    loaded(load(hub, tmp_path / "hf", HTTP_PROXY=dead, HTTPS_PROXY=dead, NO_PROXY="example.org, 127.0.0.1"))
    assert hub.downloads("model.safetensors") == 1


@pytest.mark.parametrize(
    "endpoint, variables, proxy",
    [
        ("https://huggingface.co", {"HTTPS_PROXY": "http://gate:3128"}, "http://gate:3128"),
        ("https://huggingface.co", {"HTTP_PROXY": "http://gate:3128"}, None),  # for http:// URLs only
        ("http://hub.lan:8080", {"HTTP_PROXY": "gate:3128"}, "http://gate:3128"),  # no scheme: http://
        ("https://huggingface.co", {"ALL_PROXY": "http://gate:3128"}, "http://gate:3128"),
        (
            "https://huggingface.co",
            {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:2"},
            "http://lower:1",
        ),
        ("https://huggingface.co", {"HTTPS_PROXY": "http://gate:3128", "NO_PROXY": "huggingface.co"}, None),
        ("https://hub.example.org", {"HTTPS_PROXY": "http://gate:3128", "no_proxy": "example.org"}, None),
        ("http://hub.lan:8080", {"HTTP_PROXY": "http://gate:3128", "NO_PROXY": "hub.lan:8080"}, None),
        ("https://huggingface.co", {"HTTPS_PROXY": "http://gate:3128", "NO_PROXY": "*"}, None),
        ("https://huggingface.co", {"HTTPS_PROXY": "http://gate:3128", "NO_PROXY": "face.co"}, "http://gate:3128"),
    ],
)
def test_the_proxy_probed_is_the_one_the_download_uses(monkeypatch, endpoint, variables, proxy):
    for name in [name for name in os.environ if name.lower().endswith("_proxy") or name == "REQUEST_METHOD"]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert hub_proxy(endpoint) == proxy
