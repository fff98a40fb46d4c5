"""The one error type users see: bad input, reported in one line, exit code 2."""


class BadInput(Exception):
    """Input specpair refuses: unreadable or malformed file, unknown repo or revision.

    `where` names the file (or repo) and `problem` says what is wrong with it; the CLI prints
    `error: <where>: <problem>` and exits 2, never a traceback.
    """

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # raised in a worker process, re-raised here
        return BadInput, (self.where, self.problem)
