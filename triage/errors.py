"""Errors raised by triage.

The tree::

    TriageError                 anything triage reports to a user as a one-line error
    └── InputError              a file or payload that cannot be used (exit code 2 in the CLI)
        ├── NotAPickle          not pickle, JSON, gzip or any format we read
        ├── ForbiddenGlobal     a pickle that references a global (class or function): refused unrun
        ├── TruncatedInput      the data ends before the pickle or JSON does
        ├── InputTooLarge       the data (or its decompressed form) exceeds the size bound
        ├── TooDeep             nesting deeper than the bound
        ├── MemoBomb            a pickle whose memo or objects would exceed the memory bound
        └── NotASnapshot        well-formed data that is not a torch memory snapshot
"""

from __future__ import annotations


class TriageError(Exception):
    """Base of every error triage reports to a user."""


class InputError(TriageError):
    """Input that cannot be used; the message names what is wrong."""


class NotAPickle(InputError):
    pass


class ForbiddenGlobal(InputError):
    pass


class TruncatedInput(InputError):
    pass


class InputTooLarge(InputError):
    pass


class TooDeep(InputError):
    pass


class MemoBomb(InputError):
    pass


class NotASnapshot(InputError):
    pass
