"""Train a ``tokenizers`` library model in a process of its own; :mod:`.training` runs this file as
a script (``python -c ... library_worker.py PARENT_PID``), never imports it, so it loads no more
than the library.

Why a process: the library's training loop holds the GIL once it has read its input, so in the CLI's
own process a Ctrl-C waits until training ends (minutes on a large corpus). The CLI waits on this
process instead, and kills it at a Ctrl-C or a SIGTERM.

stdin: a pickle of ``(tokenizer, trainer, pieces)`` from the parent (trusted: it made them); stdout:
the trained tokenizer's JSON. A refusal by the library: its message on stderr, exit status 3.
"""

import os
import pickle
import signal
import sys

#: Test hook: a path this process writes its pid to once the library has read every piece (its own loop
#: runs next).
FED_HOOK = "MINIGPT_TEST_TOKENIZER_FED"


def _die_with_parent(parent: int) -> None:
    """Be killed when the parent dies, even by SIGKILL (Linux; elsewhere the parent's clean-up
    alone)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call: its signal will never come
        os._exit(1)


def _fed(pieces, path):
    yield from pieces
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)  # whole when it appears


def main() -> None:
    _die_with_parent(int(sys.argv[1]))
    tok, trainer, pieces = pickle.load(sys.stdin.buffer)
    try:
        tok.train_from_iterator(_fed(pieces, os.environ.get(FED_HOOK)), trainer)
    except Exception as exc:  # the library's refusals are plain Exceptions
        print(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, file=sys.stderr)
        sys.exit(3)
    sys.stdout.buffer.write(tok.to_str().encode("utf-8"))


if __name__ == "__main__":
    main()
