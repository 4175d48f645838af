"""Errors of the resource contract: each is an `InputError`, so the CLI prints one line and exits 2.

The tree (under `triage.errors.InputError`)::

    ContractError   the contract file cannot be read or breaks its schema
    ManifestError   a manifest that is not YAML, not a workload, or not shaped like one
    ReportError     a small-scale report (scale-up request) with missing or out-of-range fields
"""

from __future__ import annotations

from triage.errors import InputError


class ContractError(InputError):
    """The contract file cannot be used; the message names the file and the key."""


class ManifestError(InputError):
    """The manifest cannot be audited; the message names the file, the document and the field."""


class ReportError(InputError):
    """A scale-up report that cannot be decided on; the message names the field."""
