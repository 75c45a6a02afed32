"""The one exception family a user sees. Each message says what to do about it."""


class RagDemoError(Exception):
    """Something the user can fix: the message is shown as is (CLI: one line on stderr, exit 2)."""


class InputError(RagDemoError):
    """A question, answer, option or file the user gave is not usable."""


class KnowledgeBaseError(RagDemoError):
    """A knowledge base folder is missing, malformed or does not match the encoder."""


class ModelLoadError(RagDemoError):
    """A model id or path could not be loaded."""


class CacheError(RagDemoError):
    """The cache folder cannot be written or holds something unusable."""


class RunStopped(RagDemoError):
    """A training run the visitor stopped before it had taken its first step."""


class IndexTooLargeError(KnowledgeBaseError):
    """An index of a KB is too large to build while serving; the message names the command that prebuilds it."""
