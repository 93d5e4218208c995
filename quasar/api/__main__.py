"""``quasar api`` (``python -m quasar.api``): serve the submission API, bring its database schema
up to date, or publish its URL on chain.

    python -m quasar.api serve [--host H] [--port P] [--workers N] [--database-url URL] [settings flags...]
    python -m quasar.api migrate [--database-url URL]
    python -m quasar.api revision -m "what changed" [--database-url URL]   (developers: new migration)
    python -m quasar.api publish-url URL --wallet.name OWNER [--subtensor.network N --netuid N]

Settings come from .env, the environment and flags (``python -m quasar.config`` lists them); the
API needs ``API_HOTKEY``, the ss58 address its clients sign for. With ``--workers N`` (``API_WORKERS``)
N processes serve the port (:mod:`quasar.api.workers`), each with its own app built from the same
arguments; they share nothing but the database (nonces, bans, rate limits) and the chain.

``publish-url`` is the subnet owner's: it writes the API's public URL and hotkey into the subnet
identity on chain, signed by the owner's coldkey, once the API answers ``GET /health`` there; miners
and validators read it when ``VALIDATOR_API_URL`` is empty (quasar/api/lookup.py).
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
import tempfile
from pathlib import Path

import uvicorn
from bittensor.sp_core import decode_ss58
from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError

from quasar import config
from quasar.api.app import create_app
from quasar.api.chaincache import CachedMetagraphChain
from quasar.api.db import Database, disk_trouble, display_url
from quasar.api.protocol import protocol_factory
from quasar.api.service import ApiConfig
from quasar.api.workers import ServerOptions, refuse_taken_port, run_workers
from quasar.chain import ChainError, said_with_cure
from quasar.chain.factory import connect
from quasar.log import setup_logging
from quasar.terminal import WrappingParser, wrapped

logger = logging.getLogger("quasar.api")

# Requests handled at once (per worker) before uvicorn answers 503: load beyond this queues in
# clients, not here.
MAX_CONCURRENT_REQUESTS = 1000
# A thread that holds the database's write lock and waits for the GIL (after each statement) waits
# up to this long for the event loop's thread to let go of it: Python's default 5 ms made every
# write transaction take tens of milliseconds under load, and every other writer wait for it.
GIL_SWITCH_INTERVAL_S = 0.0005


def build_parser(prog: str = "quasar api") -> argparse.ArgumentParser:
    parser = WrappingParser(
        prog=prog,
        description="Serve the submission API, bring its database schema up to date, or publish its URL on chain.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the API")
    config.add_arguments(serve, "api")
    serve.add_argument("--host", dest="api_host", default=None, help="same as --api.host")
    serve.add_argument("--port", dest="api_port", default=None, help="same as --api.port")
    serve.add_argument("--workers", dest="api_workers", default=None, help="same as --api.workers")
    migrate = commands.add_parser("migrate", help="create or upgrade the database schema, then exit")
    config.add_arguments(migrate, "api")
    revision = commands.add_parser("revision", help="(developers) write a new migration from the models' changes")
    revision.add_argument("-m", "--message", required=True, help="what the migration changes")
    config.add_arguments(revision, "api")
    publish = commands.add_parser(
        "publish-url",
        help="(subnet owner) publish the API's public URL and hotkey on "
        "chain, signed by the owner's coldkey (--wallet.name)",
    )
    publish.add_argument("url", help="the URL miners and validators reach the API at, e.g. https://api.example.org")
    config.add_arguments(publish, "api")
    return parser


def refuse(prog: str, message: str) -> int:
    """Print ``PROG: error: MESSAGE`` wrapped to the terminal; the exit status, 1."""
    print(wrapped(f"{prog}: error: {message}"), file=sys.stderr)
    return 1


def publish_url(settings: config.Settings, url: str, prog: str) -> int:
    """``publish-url``: the owner's wallet signs the subnet identity carrying ``url`` and the hotkey
    the API answers with."""
    from quasar.api.lookup import ApiNotFound, publish_api
    from quasar.chain.wallets import WalletError, owner_wallet

    if not settings.wallet_name:
        return refuse(
            prog, "name the subnet owner's wallet (its coldkey owns the subnet) with --wallet.name or WALLET_NAME"
        )
    try:
        wallet = owner_wallet(settings)
    except WalletError as error:
        return refuse(prog, str(error))
    try:
        location = publish_api(connect(settings), wallet, url, settings.api_hotkey)
    except (ApiNotFound, ChainError) as error:
        return refuse(prog, said_with_cure(error))
    where = f"subnet {settings.netuid} of {settings.network}"
    print(wrapped(f"published {location.url} (API hotkey {location.hotkey}) on {where}"))
    return 0


def build_app(
    settings: config.Settings, database: Database, shared_pages: Path | None = None, watch_clock: bool = True
) -> FastAPI:
    """The API on ``database`` and the chain ``settings`` name (its metagraph cached per block);
    ``shared_pages``: the directory where the server's workers share their cached reads;
    ``watch_clock``: whether this process says when its callers' refusals show its clock off."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    chain = connect(settings)
    if settings.network != config.DEV_NETWORK:
        chain = CachedMetagraphChain(chain)
    return create_app(
        ApiConfig.from_settings(settings), chain, database, shared_pages=shared_pages, watch_clock=watch_clock
    )


def worker_app(argv: list[str], shared_pages: str, number: int) -> FastAPI:
    """The app of worker ``number`` (from 0) of ``serve --workers N``, from the same arguments,
    sharing its cached reads with the other workers through ``shared_pages``. Worker 0 alone
    watches the API's clock: the workers share no count, and each said the one clock's warning
    itself (docs/api.md)."""
    _, settings = config.parse_args(build_parser(), argv)
    setup_logging(settings.debug, settings.secrets())
    return build_app(settings, Database(settings.database_url), Path(shared_pages), watch_clock=number == 0)


def main(argv: list[str] | None = None, prog: str = "quasar api") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(prog)
    args, settings = config.parse_args(parser, argv)
    setup_logging(settings.debug, settings.secrets())
    command = f"{parser.prog} {args.command}"
    if args.command == "publish-url":
        return publish_url(settings, args.url, command)
    if args.command == "serve":
        if not settings.api_hotkey:
            parser.error(
                "API_HOTKEY is not set: give the ss58 address of the API's hotkey (clients sign for it) "
                "in .env, the environment or --api.hotkey"
            )
        try:
            decode_ss58(settings.api_hotkey)
        except ValueError:
            parser.error(f"API_HOTKEY {settings.api_hotkey!r} is not an ss58 address")
        try:
            refuse_taken_port(settings.api_host, settings.api_port)
        except OSError as error:
            address = f"{settings.api_host}:{settings.api_port}"
            cure = "check API_HOST and API_PORT (--host, --port)"
            if error.errno == errno.EADDRINUSE:
                cure = (
                    "another process listens there (this API started twice?): stop it, or give this one "
                    "another API_PORT (--port)"
                )
            return refuse(command, f"cannot listen on {address}: {error.strerror}: {cure}")
    where = display_url(settings.database_url)
    try:
        database = Database(settings.database_url)
        if args.command in ("migrate", "revision"):
            database.upgrade()
            logger.info("database %s is at the newest schema", where)
            if args.command == "revision":
                database.new_migration(args.message)
            return 0
        # Built here also with several workers: a bad chain or database stops the server before
        # any worker starts, and the schema is migrated once, not by every worker at once.
        app = build_app(settings, database)
    except ChainError as error:
        return refuse(command, f"chain: {said_with_cure(error)}")
    except (SQLAlchemyError, OSError, ValueError) as error:
        trouble = disk_trouble(settings.database_url)
        # The driver's own words, without SQLAlchemy's wrapping (its class and a link to its docs).
        cause = getattr(error, "orig", None) or error
        return refuse(command, f"database {where}: {cause}" + (f"; {trouble}" if trouble else ""))
    logger.info(
        "submission API on %s:%d with %d worker(s), database %s, netuid %d (%s), hotkey %s",
        settings.api_host,
        settings.api_port,
        settings.api_workers,
        where,
        settings.netuid,
        settings.network,
        settings.api_hotkey,
    )
    # proxy_headers=False: the client IP comes from TRUSTED_PROXIES only, never from uvicorn's defaults.
    # A line per request only with --logging.debug: the API logs every state change itself, and at
    # hundreds of requests a second the access log costs a tenth of the CPU. The request line and
    # headers are limited in size and time (quasar/api/protocol.py).
    options = ServerOptions(
        host=settings.api_host,
        port=settings.api_port,
        proxy_headers=False,
        server_header=False,
        log_config=None,
        access_log=settings.debug,
        limit_concurrency=MAX_CONCURRENT_REQUESTS,
        timeout_graceful_shutdown=10,
        # uvicorn calls ``http`` as a protocol factory (server.py's create_protocol), so a partial
        # works as a class does; its annotation names a class only.
        http=protocol_factory(settings.api_max_header_bytes, settings.api_header_timeout),  # type: ignore[typeddict-item]
    )
    if settings.api_workers == 1:
        uvicorn.run(app, **options)
    else:
        database.dispose()
        # Private to this server (mode 0700) and removed when it stops: the workers' shared reads.
        with tempfile.TemporaryDirectory(prefix="quasar-api-reads-") as shared_pages:
            run_workers(settings.api_workers, "quasar.api.__main__:worker_app", (argv, shared_pages), options)
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m quasar.api"))
