"""
The run's safety, around the training train.py shows: one run per out_dir, the data a run trains
on, checkpoints that load, nothing non-finite saved, a diverging run stopped with the command that
continues it, signals that stop after a step with the state saved, and every DDP process agreeing.
A reader of the tutorial may skip this file: train.py calls it in a few lines named by what they protect.

    with guards.Launch(config) as launch:      # locks, checks, signals; undone if the launch fails
        saved = launch.load_resumable()        # ckpt.pt, checked against the config and the data
        launch.check_step(iteration, loss, aux, grad_norm)   # non-finite: stop before the weights change
        with launch.evaluation(iter_num):      # what stops rank 0 here stops every process
            launch.check_evaluation(...)       # non-finite: stop; diverging: keep the last good state
        launch.stop_if_requested(iter_num, save)  # after a signal: every process stops after this step
"""

import contextlib
import fcntl
import math
import os
import shlex
import signal
import socket
import sys
import zipfile
from contextlib import suppress

import torch
import torch.distributed as dist

import configurator
from lib import checkpoint, cli, data, machine, settings
from lib.cli import ConfigError, UserError

DIVERGED_NATS = 1.0  # an evaluation this far above the run's best val loss holds no state worth resuming


# --------------------------------------------------------------------------------------
# one launch of train.py


class Launch:
    """`with Launch(config) as launch:` around one launch of train.py, in each of its processes.

    On entering: under torchrun, joins the process group (launch.rank, .world_size, .device);
    rank 0 holds the data folder's shared lock, checks the settings and the data before anything
    is written (launch.data_identity), and claims out_dir (train.lock); the stop signals then ask
    for a stop after the step under way (stop_if_requested). On leaving after a failure, an out_dir
    this launch created and never saved a checkpoint to is removed; the locks and the process group
    are released in any case. as_script: the process is train.py's own, where a second signal ends it
    within seconds whatever hangs in its teardown."""

    def __init__(self, config, as_script=False):
        self.config, self.as_script = config, as_script
        self.out_lock = self.data_lock = self.data_identity = self.data_stamps = None
        self.ckpt_path = os.path.join(config["out_dir"], "ckpt.pt")
        self.last_good = None  # (iteration, val loss) of the state in ckpt.pt that a resume can continue from
        self.under_way = "the evaluation at iteration 0"  # what a stop waits for, as a signal's acknowledgement says
        self.first_val_loss = None  # the run's first evaluation's, the untrained model's
        self.diverging = False  # the last evaluation's state was too far above the best to save
        self.evaluated = (None, None)  # (iteration, val loss) of the last evaluation

    def __enter__(self):
        self.rank, self.world_size, self.device = setup_distributed(self.config)
        self.master, self.ddp = self.rank == 0, self.world_size > 1
        try:
            with self.rank0_decides():
                if self.master:
                    self.data_lock = data.hold_for_reading(self.config["data_dir"])  # before the data is checked
                    self.data_identity, self.data_stamps = check_before_writing(self.config, self.world_size)
                    self.out_lock = claim_out_dir(self.config)
                    busy = self.device == "cpu" and machine.busy_cpu_note(torch.get_num_threads())
                    if busy:  # other processes on the cores torch's threads need: many times slower
                        print(busy, file=sys.stderr)
            acknowledge = self.acknowledge if self.master else None
            self.stop = cli.StopRequests(acknowledge, passed_on=self.ddp, exit_within_s=10.0 if self.as_script else None)
            self.stop.__enter__()
            self.pipe = cli.quiet_when_closed(on_close=self.pipe_closed)
            self.pipe.__enter__()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, kind, error, traceback):
        for context in ("pipe", "stop"):
            if hasattr(self, context):
                getattr(self, context).__exit__(kind, error, traceback)
        out_of_memory = isinstance(error, torch.OutOfMemoryError) or is_cpu_out_of_memory(error)
        if self.out_lock:
            if kind is not None:  # removes out_dir if this launch made it and wrote nothing there
                self.out_lock.undo(fresh_run=out_of_memory and self.config["init_from"] == "scratch")
            self.out_lock.close()
        if self.data_lock:
            self.data_lock.close()
        if "RANK" in os.environ and dist.is_initialized():  # setup_distributed joined a process group
            dist.destroy_process_group()
        if out_of_memory:
            raise UserError(out_of_memory_advice(self.config, self.under_way)) from None
        return False

    def pipe_closed(self):
        """stdout's reader went away: a stop, as after a SIGPIPE, unless one is already under way
        (a Ctrl-C in a pipeline reaches the reader too), which it must not turn into a stop at once."""
        if self.stop.signum is None:
            self.stop.request(signal.SIGPIPE, None)

    @contextlib.contextmanager
    def rank0_decides(self):
        """Within it, the problem (UserError) rank 0 meets becomes every process's, so all stop together."""
        problem = None
        try:
            yield
        except UserError as e:
            problem = e
        if self.ddp:
            shared = [problem]
            dist.broadcast_object_list(shared, src=0)
            problem = shared[0]
        if problem:
            raise problem

    # ----------------------------------------------------------------------------------
    # resuming

    def load_resumable(self):
        """out_dir/ckpt.pt to resume from (every process reads it): it must hold the training state
        of the model the config asks for; rank 0 then checks it trained on this data (unless
        --new_data=True) and prints the settings that changed. Skipped by --eval_only."""
        saved = load_checkpoint(self.ckpt_path, checkpoint.TRAINING_KEYS)
        check_resume(saved, self.config, settings.model_args_of(self.config))
        # a checkpoint without last_eval_iter was saved right after its evaluation
        saved.setdefault("last_eval_iter", saved["iter_num"])
        if not self.config["eval_only"]:
            with self.rank0_decides():
                if self.master:
                    check_data_identity(saved, self.data_identity, self.config["new_data"], self.config["out_dir"])
                    changed = changed_settings(saved, self.config)
                    if changed:
                        print(f"resumed with settings that differ from the checkpoint's: {changed}")
        self.last_good = (saved["iter_num"], None)
        self.under_way = self.upcoming(saved["iter_num"], evaluated=saved["last_eval_iter"] == saved["iter_num"])
        self.first_val_loss = saved.get("first_val_loss")
        return saved

    # ----------------------------------------------------------------------------------
    # a step, an evaluation

    def check_step(self, iteration, loss, aux, grad_norm, fp16):
        """Stops the run before a step whose loss or gradient is not finite reaches the weights (every
        process sees the same numbers). Under fp16 a non-finite gradient is the gradient scaler's
        business: it skips that step and lowers its scale."""
        values = [("loss", loss), *checkpoint.flat_aux(aux), *([] if fp16 else [("gradient norm", grad_norm)])]
        bad = [name for name, value in values if not math.isfinite(value)]
        if bad:
            self.diverged(f"iteration {iteration}: non-finite {', '.join(bad)} "
                          f"({', '.join(f'{n} {v}' for n, v in values)})")

    @contextlib.contextmanager
    def evaluation(self, iter_num):
        """Around an evaluation (rank 0's): a signal meanwhile stops the run when it ends, and a problem
        found there (rank0_decides) stops every process."""
        self.under_way = f"the evaluation at iteration {iter_num}"  # until stop_if_requested has looked
        with self.rank0_decides():
            yield

    def check_data_unchanged(self):
        """Stops the run when its data files were rewritten since it hashed them (a cheap check of
        sizes and times, at each evaluation)."""
        if self.data_stamps is not None and data.stamps(self.config["data_dir"]) != self.data_stamps:
            raise UserError(f"the data in {self.config['data_dir']} changed during the run (train.bin, val.bin or "
                            f"meta.json were rewritten): stopped without saving; {self.ckpt_path} keeps the state "
                            f"trained on the data this run started with — resume it on that data, or with "
                            f"--new_data=True")

    def check_evaluation(self, iter_num, losses, best_val_loss):
        """Before the state of an evaluation is saved: non-finite losses stop the run (a non-finite
        weight, save); a val loss above the run's first evaluation's (the untrained model's) gets a
        warning. A val loss DIVERGED_NATS or more above the best marks the run as diverging
        (launch.diverging): ckpt.pt then keeps the last state a resume can continue from, and a
        warning says so."""
        if not all(math.isfinite(loss) for loss in losses.values()):
            self.diverged(f"non-finite losses at the evaluation of iteration {iter_num} (train {losses['train']}, "
                          f"val {losses['val']})")
        val_loss = losses["val"]
        if self.first_val_loss is None:
            self.first_val_loss = val_loss
        elif val_loss > self.first_val_loss:
            print(f"warning: val loss {val_loss:.4f} at iteration {iter_num} is above the run's first evaluation's, "
                  f"{self.first_val_loss:.4f}: the run is diverging — try a lower --learning_rate", file=sys.stderr)
        if self.last_good and val_loss >= best_val_loss + DIVERGED_NATS:
            self.diverging = True
            print(f"warning: not saving {self.ckpt_path} at iteration {iter_num}: its val loss {val_loss:.4f} is "
                  f"{DIVERGED_NATS:g} or more above the run's best, {best_val_loss:.4f}; it keeps "
                  f"{good_state(*self.last_good)}, the state to resume with a lower learning rate", file=sys.stderr)
        else:
            self.diverging = False
        self.evaluated = (iter_num, val_loss)  # ckpt.pt's val loss, once save has written it

    def diverged(self, what):
        """Stops a run that diverged: what was not finite, which saved state to resume, and the command
        that resumes it with a learning rate that can work."""
        lowered = lower_learning_rate(self.config)
        if self.last_good:
            where = (f"{self.ckpt_path} ({good_state(*self.last_good)}) holds the last good state; resume it with "
                     f"{lowered['why']}: {rerun_command(self.world_size, init_from='resume', **lowered['flags'])}")
        else:
            where = (f"no state was saved; start again with {lowered['why']}: "
                     f"{rerun_command(self.world_size, overwrite='True', **lowered['flags'])}")
        raise UserError(f"{what}: stopped, nothing non-finite was saved; {where}")

    def save(self, path, state):
        """checkpoint.save_checkpoint, for a state without a non-finite weight or optimizer value:
        otherwise the run stops as a diverged one, and the previous file is kept."""
        bad = nonfinite_tensors(state)
        if bad:
            self.diverged(f"iteration {state['iter_num']}: non-finite values in {bad[0]}")
        checkpoint.save_checkpoint(path, state)
        if path == self.ckpt_path:  # the state a resume continues from, with its val loss if evaluated
            iteration, val_loss = self.evaluated
            self.last_good = (state["iter_num"], val_loss if iteration == state["iter_num"] else None)

    # ----------------------------------------------------------------------------------
    # signals

    def acknowledge(self, signum):
        """The line a first signal gets at once: what the stop waits for, which may take minutes."""
        return f"{signal.Signals(signum).name}: stopping after {self.under_way} with its state saved; {cli.again(signum)}"

    def stop_if_requested(self, iter_num, save=None):
        """After a signal to any process, every process stops here, after the same step: save() (on
        every process; None when the state was just saved) writes ckpt.pt, then cli.Stopped ends the
        run with the command that continues it."""
        # what comes next: a signal from the moment signum is read stops after it
        signum, self.under_way = self.stop.signum, self.upcoming(iter_num, evaluated=save is None)
        if self.ddp:
            flag = torch.tensor([signum or 0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            signum = flag.item() or None
        if not signum:
            return
        if save:
            save()
        saved = f"saved {self.ckpt_path}"
        if self.diverging:  # the state since the last good one diverged: ckpt.pt keeps that one
            saved = f"{self.ckpt_path} keeps {good_state(*self.last_good)}, the run's last good state"
        note = ""
        if self.master:
            note = (f"stopped by {signal.Signals(signum).name} after iteration {iter_num}: {saved}; "
                    f"continue with: {rerun_command(self.world_size, init_from='resume')}")
        raise cli.Stopped(signum, note)

    def upcoming(self, iter_num, evaluated):
        """What a run at iter_num does next: the evaluation due there, if not made yet, or the next step."""
        due = iter_num % self.config["eval_interval"] == 0 or iter_num == self.config["max_iters"]
        return f"the evaluation at iteration {iter_num}" if due and not evaluated else f"iteration {iter_num + 1}"

    def gather_rng_states(self, batch_generator):
        """Every rank's random states (checkpoint.get_rng_state), on every rank, for ckpt.pt."""
        states = [None] * self.world_size
        if self.ddp:
            dist.all_gather_object(states, checkpoint.get_rng_state(batch_generator))
        else:
            states[0] = checkpoint.get_rng_state(batch_generator)
        return states


# --------------------------------------------------------------------------------------
# processes: one, or one per GPU under torchrun


def setup_distributed(config):
    """(rank, world_size, device); under torchrun (RANK set) joins the process group."""
    if "RANK" not in os.environ:
        return 0, 1, config["device"]
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if config["device"].startswith("cuda"):
        device, backend = f"cuda:{local_rank}", config["backend"]
        torch.cuda.set_device(device)
    else:
        device, backend = "cpu", "gloo"  # nccl needs GPUs
    dist.init_process_group(backend=backend)
    return rank, world_size, device


# --------------------------------------------------------------------------------------
# before anything is written


def check_before_writing(config, world_size):
    """Everything that can fail before training starts fails here, before anything is written
    to out_dir: settings, the data, wandb (the device was checked with the settings). Returns the
    data's identity (data.check_data) and its stamps, taken before it was hashed."""
    if config["gradient_accumulation_steps"] % world_size:
        raise ConfigError(f"gradient_accumulation_steps ({config['gradient_accumulation_steps']}) is the total over "
                          f"all processes and must be divisible by the world size ({world_size})")
    if config["eval_only"] and config["init_from"] != "resume":
        raise ConfigError("eval_only=True evaluates a trained run's ckpt.pt: add --init_from=resume")
    settings.model_args_of(config)  # the model's own checks (GPTConfig)
    stamps = data.stamps(config["data_dir"])  # first: a change while the files are hashed shows at the first evaluation
    identity = data.check_data(config["data_dir"], config["block_size"], config["vocab_size"])
    if config["wandb_log"]:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("wandb_log=True needs wandb: `pip install wandb`, or drop --wandb_log") from None
    return identity, stamps


class FolderLock:
    """This process's lock on FOLDER/NAME, a file that names the holder: the kernel's (flock), so
    it ends with its process, however that dies (kill -9 included); close() unlocks. A second
    process is refused at once, in one line that names the holder. The folder is created if
    need be; undo() removes what the lock created, so a script that fails before writing
    anything leaves nothing behind."""

    def __init__(self, folder, name, program, option):
        self.folder, self.path = folder, os.path.join(folder, name)
        made = []  # the folders makedirs is about to create, the deepest first
        parent = os.path.abspath(folder)
        while not os.path.exists(parent):
            made.append(parent)
            parent = os.path.dirname(parent)
        try:
            os.makedirs(folder, exist_ok=True)
            new_file = not os.path.exists(self.path)
            self.file = open(self.path, "a+")
        except OSError as e:
            raise UserError(f"cannot create {option} {folder} ({e.strerror}): choose another --{option}") from None
        self.created = [self.path] * new_file + made  # what undo() removes, in this order
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise UserError(f"{folder} is in use by {holder}: wait for it to end, or choose another --{option}") from None
        self.file.truncate(0)
        self.file.write(f"{program} (process {os.getpid()} on {socket.gethostname()})\n")
        self.file.flush()
        self.keep()

    def contents(self):
        """Every entry of the folder but the lock file, with its size: what the script wrote."""
        return {entry.name: entry.stat().st_size for entry in os.scandir(self.folder) if entry.path != self.path}

    def keep(self):
        """The folder as it is now counts as untouched: undo() removes nothing once it holds more."""
        self.untouched = self.contents()

    def close(self):
        self.file.close()

    def undo(self, fresh_run=False):
        """Unlock; when nothing was written to the folder since the lock was taken, also remove
        the lock file and the folders, if the lock created them (only those). fresh_run: a new run's
        log.jsonl counts as nothing written while no checkpoint joined it (a run that failed before
        its first save, out of memory say, leaves no folder that the next run would refuse)."""
        written = {name for name, size in self.contents().items() if self.untouched.get(name) != size}
        if fresh_run and written == {"log.jsonl"} and "log.jsonl" not in self.untouched:
            with suppress(OSError):
                os.remove(os.path.join(self.folder, "log.jsonl"))
        if self.contents() == self.untouched:
            for path in self.created:
                with suppress(OSError):  # a folder that holds something else stays
                    (os.remove if path == self.path else os.rmdir)(path)
        self.close()


def claim_out_dir(config):
    """Create and lock out_dir for this process: a FolderLock on out_dir/train.lock.
    A new run (init_from='scratch') refuses a folder that holds a run unless overwrite=True."""
    out_dir = config["out_dir"]
    lock = FolderLock(out_dir, "train.lock", "train.py", "out_dir")
    for name in ("ckpt.pt.tmp", "best.pt.tmp"):  # left by a save that was killed (kill -9)
        with suppress(FileNotFoundError):
            os.remove(os.path.join(out_dir, name))
    existing = [name for name in checkpoint.RUN_FILES if os.path.exists(os.path.join(out_dir, name))]
    if config["init_from"] == "scratch" and existing:
        if not config["overwrite"]:
            lock.undo()
            if "ckpt.pt" not in existing:  # nothing to resume from
                raise UserError(f"{out_dir} holds the log of a run that stopped before its first checkpoint: start "
                                f"it again with --overwrite=True (deletes {', '.join(existing)}), or use another --out_dir")
            raise UserError(
                f"{out_dir} already holds a run ({', '.join(existing)}): continue it with --init_from=resume, "
                f"start this one in another --out_dir, or replace it with --overwrite=True (deletes {', '.join(existing)})"
            )
        for name in existing:
            os.remove(os.path.join(out_dir, name))
        print(f"overwrite=True: deleted {', '.join(existing)} in {out_dir}")
    lock.keep()  # the deletions above count as done before the run
    return lock


# --------------------------------------------------------------------------------------
# reading a checkpoint back: whole, ours, and the model asked for


def load_checkpoint(path, keys=checkpoint.MODEL_KEYS, mmap=False):
    """A checkpoint train.py wrote (on the CPU) holding `keys` (TRAINING_KEYS to resume from);
    UserError saying what is wrong otherwise. mmap=True maps its tensors instead of reading them."""
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        if os.path.isfile(os.path.join(folder, "log.jsonl")):
            raise UserError(f"no checkpoint at {path}: the run in {folder} stopped before its first one — start it "
                            f"again with --overwrite=True (deletes its log.jsonl), or use another --out_dir")
        raise UserError(f"no checkpoint at {path} — train one first (python train.py CONFIG --out_dir={folder})")
    check_crc(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # a damaged or foreign file; torch's own advice (weights_only=False) would run its code
        reason = "not a complete torch file" if isinstance(e, RuntimeError) else "it holds objects train.py never saves"
        raise UserError(f"{path} is not a checkpoint written by train.py, or it is damaged ({reason}): "
                        f"train again into a new --out_dir, or resume from a good copy") from None
    missing = [key for key in keys if not isinstance(state, dict) or key not in state]
    if missing:
        ours = isinstance(state, dict) and "format" in state  # best.pt, say, where ckpt.pt was asked for
        what = "a checkpoint to resume from (best.pt holds a model only)" if ours else "a checkpoint"
        raise UserError(f"{path} is not {what} written by train.py: it lacks {', '.join(missing)}")
    if state["format"] != checkpoint.FORMAT:
        raise UserError(f"{path} has format {state['format']!r}; this train.py reads {checkpoint.FORMAT!r}")
    if state["model_type"] not in settings.MODELS:
        raise UserError(f"{path} holds an unknown model_type {state['model_type']!r} (known: {', '.join(settings.MODELS)})")
    return state


def check_crc(path):
    """Refuse a checkpoint whose bytes changed after it was written: torch's zip container stores a
    CRC32 per member, and ZipFile.testzip() reads every member against it. A file that is not a
    zip at all is left to torch.load, whose failure says so."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # the first member whose bytes fail their CRC32, or None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return
    if damaged:
        folder, name = os.path.split(path)
        advice = {  # what else the run's folder may offer
            "ckpt.pt": f"; {os.path.join(folder, 'best.pt')} (the best model, no optimizer state) may be whole",
            "best.pt": f", or load the latest state instead (--checkpoint=latest, {os.path.join(folder, 'ckpt.pt')})",
        }.get(name, "")
        raise UserError(f"{path} is damaged: its member {damaged} fails its CRC32 check (the file changed on disk "
                        f"after it was written) — restore a good copy of it, or train again{advice}")


def saved_iteration(path):
    """The iteration of a checkpoint, read without loading its tensors into memory (study.py
    reads it for every run folder); the UserError of load_checkpoint for a file it cannot read."""
    return load_checkpoint(path, checkpoint.TRAINING_KEYS, mmap=True)["iter_num"]


def check_resume(saved, config, model_args):
    """The checkpoint must hold the model the config asks for."""
    if saved["model_type"] != config["model_type"]:
        raise UserError(f"cannot resume: the checkpoint holds model_type {saved['model_type']!r}, "
                        f"the config asks for {config['model_type']!r}")
    recorded = settings.saved_model_args(saved["model_type"], saved["model_args"])
    differ = [f"{key} (checkpoint {recorded.get(key)!r}, config {value!r})"
              for key, value in model_args.items() if recorded.get(key) != value]
    if differ:
        raise UserError(f"cannot resume: model settings differ from the checkpoint's: {', '.join(differ)}")


LAUNCH_KEYS = ("init_from", "overwrite", "new_data", "eval_only")  # how a launch starts, not what it trains


def changed_settings(saved, config):
    """'key old → new, ...' for every setting of config that differs from the checkpoint's config
    (keys the checkpoint predates left out), or None."""
    before = saved["config"]
    changed = [f"{key} {before[key]!r} → {value!r}" for key, value in config.items()
               if key in before and key not in LAUNCH_KEYS and before[key] != value]
    return ", ".join(changed) or None


def check_data_identity(saved, identity, new_data, out_dir):
    """Resuming on other data is refused unless new_data; with it, best.pt starts afresh when the val
    data changed (a val loss compares only with those measured on the same val data): the previous
    best.pt is renamed, and the checkpoint's best_val_loss and first_val_loss are reset."""
    recorded = saved.get("data")
    if recorded is None:  # written before checkpoints recorded their data
        print(f"note: {out_dir}/ckpt.pt does not record the data it trained on; from now on it records "
              f"{data.short_identity(identity)}")
        return
    same = [split for split in ("train", "val") if recorded[f"{split}_sha256"] == identity[f"{split}_sha256"]]
    if len(same) == 2:
        return
    if not new_data:
        raise UserError(f"cannot resume: {out_dir}/ckpt.pt trained on other data, {data.short_identity(recorded)}, "
                        f"than {data.short_identity(identity)}: resume with that data, or pass --new_data=True to "
                        f"train on this data from here")
    print(f"new_data=True: training on {data.short_identity(identity)} from here (before: {data.short_identity(recorded)})")
    if "val" in same:
        return
    saved["best_val_loss"], saved["first_val_loss"] = float("inf"), None
    best = os.path.join(out_dir, "best.pt")
    if os.path.isfile(best):
        kept, number = os.path.join(out_dir, f"best-val-{recorded['val_sha256'][:12]}.pt"), 1
        while os.path.exists(kept):  # a name no earlier change of data took
            number += 1
            kept = os.path.join(out_dir, f"best-val-{recorded['val_sha256'][:12]}-{number}.pt")
        os.replace(best, kept)
        print(f"new_data=True: the val data changed, so best.pt starts afresh; the previous one is kept as {kept}")


# --------------------------------------------------------------------------------------
# what is not finite, and what to do about a run that diverged


def nonfinite_tensors(state):
    """The names (model/..., optimizer/...) of the floating-point tensors in a checkpoint that hold
    a NaN or an infinity. One read per device for the whole state (a GPU syncs once); the names
    are looked for only when something is not finite."""
    named = [(name, t) for name, t in checkpoint.named_tensors(state) if t.is_floating_point()]
    finite_by_device = {}  # AdamW's step counts stay on the CPU while the weights are on a GPU
    for _, t in named:
        finite_by_device.setdefault(t.device, []).append(torch.isfinite(t).all())
    if all(torch.stack(finite).all().item() for finite in finite_by_device.values()):
        return []
    return [name for name, t in named if not torch.isfinite(t).all()]


def good_state(iteration, val_loss):
    """'iteration 40, val loss 5.4321': the state ckpt.pt holds (its val loss unknown after a resume)."""
    return f"iteration {iteration}" + (f", val loss {val_loss:.4f}" if val_loss is not None else "")


def lower_learning_rate(config):
    """The learning rate to go on with after a divergence, and why: the config's own (its file's, or
    the default) when this run's is far above it, else half this run's."""
    try:  # the command line's config files, without its flags
        files = [arg for arg in configurator.normalize(sys.argv[1:]) if not arg.startswith("-")]
        own = settings.get_config([*files, f"--model_type={config['model_type']}"])
    except ConfigError:  # not train.py's command line (a test, a notebook)
        own = settings.DEFAULTS
    lr, own_lr = config["learning_rate"], own["learning_rate"]
    if lr > 4 * own_lr:
        new_lr, why = own_lr, f"the config's own learning rate, {own_lr:g} ({lr:g} is {lr / own_lr:,.0f}× that)"
    else:
        new_lr, why = lr / 2, "half the learning rate"
    flags = {"learning_rate": f"{new_lr:g}"}
    if config["decay_lr"] and config["min_lr"] > new_lr:
        flags["min_lr"] = f"{min(config['min_lr'], own['min_lr'], new_lr):g}"  # min_lr may not exceed learning_rate
    return dict(flags=flags, why=why)


def rerun_command(world_size, **changes):
    """This launch's command line, with --key=value for each of changes instead of the launch's own."""
    dropped = ("--init_from=", "--overwrite=", *(f"--{key}=" for key in changes))
    args = [arg for arg in configurator.normalize(sys.argv[1:]) if not arg.startswith(dropped)]
    launcher = ["python", "train.py"] if world_size == 1 else ["torchrun", "--standalone", f"--nproc_per_node={world_size}", "train.py"]
    return " ".join(shlex.quote(arg) for arg in [*launcher, *args, *(f"--{key}={value}" for key, value in changes.items())])


# --------------------------------------------------------------------------------------
# out of memory


def is_cpu_out_of_memory(error):
    """A CPU allocation that failed: torch raises a plain RuntimeError that says so."""
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def out_of_memory_advice(config, under_way):
    """What to do when a step or an evaluation does not fit in memory."""
    where = "the GPU" if config["device"].startswith("cuda") else "this machine's memory"
    return (f"out of memory during {under_way}: a micro-step of {config['batch_size']} sequences of "
            f"{config['block_size']} tokens does not fit in {where}; lower --batch_size (and raise "
            f"--gradient_accumulation_steps to keep the tokens per step) or --block_size")
