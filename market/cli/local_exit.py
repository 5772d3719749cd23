"""Exit codes of a command that ran a local model in process (``llm:hf`` seats).

torch and xgrammar run native threads (the engine's decoding, grammar compilation). When the
interpreter finalises with one of them busy, a C++ thread object is destroyed while still
running and the C++ runtime aborts the process: ``terminate called without an active
exception`` and exit code 134 (SIGABRT) instead of 130 after Ctrl-C, whatever the command had
already written. So once a model was loaded, a command that ends with a non-zero code (Ctrl-C,
an error, ``--strict``) flushes its output and leaves with ``os._exit(code)``, skipping the
finalisation. By then a run has closed its folder (finished episodes are on disk, written and
flushed one by one); nothing else needs the finalisation. A command that succeeds exits
normally: its model calls have all returned. Only the command line does this (``main()``
without arguments), never a program that calls ``main([...])``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable

INTERRUPTED = 130  # the exit code of Ctrl-C (128 + SIGINT)


def local_models_loaded() -> bool:
    """Whether this process began loading an in-process model (read without importing the
    backend: a command that never used one never imported it)."""
    loading = sys.modules.get("agents.llm.backends.hf_loading")
    return loading is not None and bool(getattr(loading, "models_loaded", lambda: False)())


def leave(code: int) -> None:
    """Flush stdout, stderr and the logging handlers, then end the process with ``code`` now."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone (a reader that left)
            stream.flush()
    logging.shutdown()
    os._exit(code)


def exit_hard_after(
    run: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """``run``, ending the process at once (:func:`leave`) when it returns a non-zero code, is
    interrupted (130) or raises (the traceback, then 1) after a local model was loaded."""

    def command(args: argparse.Namespace) -> int:
        try:
            code = run(args)
        except KeyboardInterrupt:
            if not local_models_loaded():
                raise
            print("interrupted", file=sys.stderr)
            leave(INTERRUPTED)
            raise  # not reached: leave() ends the process
        except Exception:
            if not local_models_loaded():
                raise
            traceback.print_exc()
            leave(1)
            raise
        if code and local_models_loaded():
            leave(code)
        return code

    return command
