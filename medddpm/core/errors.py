"""Exceptions the CLI turns into a single line on stderr and exit code 2."""


class MedddpmError(Exception):
    """Base of the errors a user can act on."""


class InputError(MedddpmError, ValueError):
    """A problem with the user's input (files, options, hardware); the message says what to fix."""


class DivergedError(MedddpmError, RuntimeError):
    """Training produced a NaN or infinite loss; the last good checkpoint is left intact."""
