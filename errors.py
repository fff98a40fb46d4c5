"""The errors users see, each reported in one line (or one JSON document under --json) with its exit code.

Exit codes of every command: 0 done (a check found the pair runnable, a gate found every drafted reply identical);
1 a finding (a gate's divergence, a verify mismatch, all stacks failing) or Incomplete work; 2 BadInput and usage
errors; INCONCLUSIVE_EXIT (3) a gate that compared too few generated tokens to prove anything; 130 Ctrl-C and
128 + N for signal N (Interrupted).
"""

INCONCLUSIVE_EXIT = 3  # `run`/`bench` with a drafter: fewer than 16 generated tokens compared in a setting


class BadInput(Exception):
    """Input specpair refuses: unreadable or malformed file, unknown repo or revision. Exit code 2.

    `where` names the file (or repo, or argument) and `problem` says what is wrong with it; the CLI prints
    `error: <where>: <problem>` and exits 2, never a traceback.
    """

    exit_code = 2

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # raised in a worker process, re-raised here
        return type(self), (self.where, self.problem)


class Incomplete(Exception):
    """Work that started and did not complete (a write failed, the disk filled up, the Hub kept failing).
    Exit code 1: running it again resumes or starts afresh. Not a BadInput: nothing that refuses input
    catches it."""

    exit_code = 1

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.where, self.problem)


class RankFailed(Incomplete):
    """A rank of a tensor-parallel run ended in an error and the others were stopped; the exit code is that
    rank's (its own error line came first, from rank 0, or is quoted in `problem`)."""

    def __init__(self, where: str, problem: str, exit_code: int) -> None:
        super().__init__(where, problem)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type, tuple[str, str, int]]:
        return type(self), (self.where, self.problem, self.exit_code)


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived during work that cleans up after itself (convert removes DST.specpair-partial);
    the process then ends with 128 + the signal's number. A BaseException, so no error handler swallows it."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum
