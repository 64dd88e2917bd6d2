"""Child processes that receive Ctrl-C as they would at a terminal.

A shell that runs a command in the background (CI runners, `nohup`, `cmd &`) starts it with SIGINT ignored, every
process below inherits that, and Python keeps a SIGINT that was ignored at start-up ignored. A test that sends
SIGINT to such a child would see the command run to completion and could not tell an interrupt path from none.
"""

from __future__ import annotations

import signal


def ctrl_c_as_at_a_terminal() -> None:
    """Popen's preexec_fn: SIGINT back to its default action in the child, whatever the test runner inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
