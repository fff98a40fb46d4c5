"""The application layer: what each command does, as library functions with typed results, below a thin CLI.

`cli/` parses arguments, calls one of these and prints what it returns (through `cli/_output.Output`); nothing
here prints. Long work reports through a `progress.Progress` it is given (stages, notes, warnings, metered work),
silent by default. Heavy imports (torch, the runtime) stay inside functions: `check` must not pay for them.

- `check.check_pair`: open a target and its drafter (or a specpair.lock) and judge them on each stack.
- `pair.gate_pair`: which pair the gate runs (TARGET DRAFT, TARGET --mtp, a specpair.lock, or the demo); the gate
  and bench take a checkpoint opened already (`sources/model.open_files`) wherever they take a ref (`pair.opened`).
- `device.choose_device`, `memory.check_fits` / `memory.does_not_fit`: where the runtime runs and whether it fits.
- `models.load_target`: plan and load a target with progress; `models.revision` / `file_hashes`: provenance.
- `generation.generate_text`: one undrafted generation, its text streamed as it grows.
- `gate.run_gate`: the same prompts undrafted and drafted, compared token by token (a `GateReport`).
- `bench.run_bench`: decode tok/s by users and by depth against the weights roofline (a `BenchReport`).
- `convert.plan_conversion` / `convert.run_conversion`, `download.plan_download` / `download.fetch`,
  `verify.verify_lock`: the converter, downloader and lock check with their progress.
"""
