"""The two ways a command ends early. The CLI turns them into exit codes; steps only raise them."""


class BadInput(Exception):
    """The user handed in something unusable (exit 2): say what and where, in one line."""


class Refused(Exception):
    """The tool could not classify or close and says why (exit 3)."""
