"""The one error of the sweep code that reaches the user."""


class SweepError(ValueError):
    """A user mistake in a sweep file or option: one line, printed without a traceback."""
