"""Several processes and nodes, the checks before work: every process runs the same run into one shared output
folder (the process group itself, formed and ended, is `hfbert.pretraining.process_group`'s).

Every function is a no-op in a single-process run.
"""

from __future__ import annotations

import os
import secrets
import socket
from importlib.metadata import version
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import gather_object

from hfbert.corpus_arguments import corpus_fingerprint
from hfbert.errors import Refusal
from hfbert.files import describe_write_failure, read_json, write_json_atomic
from hfbert.pretraining.data import PreparedData, count_training_instances, tokenizer_fingerprint
from hfbert.pretraining.process_group import checked_on_main_process, end_process_group
from hfbert.pretraining.settings import PretrainingSettings

# Written by rank 0 into --output_dir and read back by every rank: is the folder one folder for all of them?
SHARED_FOLDER_PROBE_NAME = ".hfbert-shared-folder-probe.json"
VERSIONED_PACKAGES = ("hfbert", "transformers", "torch", "accelerate", "datasets", "tokenizers")


def check_output_dir_shared(output_dir: Path, accelerator: Accelerator) -> None:
    """Refuse an --output_dir that is not one folder for every rank (e.g. a node-local disk at the same path):
    rank 0 writes a random token there, every rank reads it back, all learn who did not see it."""
    if accelerator.num_processes == 1:
        return
    probe = output_dir / SHARED_FOLDER_PROBE_NAME

    def write_probe() -> None:
        try:
            write_json_atomic(probe, {"token": secrets.token_hex(16)})
        except OSError as error:  # a resume onto a full disk
            raise Refusal(
                f"--output_dir {output_dir}: {describe_write_failure(error, probe)}; free space on its disk "
                f"(`df -h {output_dir}`) and run the same command again"
            ) from error

    checked_on_main_process(accelerator, write_probe)  # its refusal ends every rank, not a barrier's error
    try:
        token = read_json(probe, "")["token"]
    except (OSError, ValueError, KeyError, TypeError):  # missing (another folder) or unreadable: not seen
        token = None
    views = gather_object([(accelerator.process_index, where_am_i(), token)])
    if accelerator.is_main_process:
        probe.unlink()
    accelerator.wait_for_everyone()  # gone before any rank looks at the folder's files
    blind = [(rank, where) for rank, where, seen in views if seen is None or seen != views[0][2]]
    if blind:
        end_process_group(accelerator)
        ranks = ", ".join(f"rank {rank} ({where})" for rank, where in blind)
        raise Refusal(
            f"--output_dir {output_dir} is not one folder shared by every node: {ranks} do not see the file rank "
            "0 wrote into it, so their parts of every checkpoint would never reach it. Checkpoints and the final "
            "folder must be on a filesystem every node mounts at the same path (NFS, Lustre, a shared volume): "
            "pass such a folder as --output_dir on every node."
        )


def where_am_i() -> str:
    """'node N, host H' of this process (torchrun's GROUP_RANK is the node's rank)."""
    return f"node {os.environ.get('GROUP_RANK', '0')}, host {socket.gethostname()}"


def run_fingerprint(settings: PretrainingSettings, prepared: PreparedData | None) -> dict[str, Any]:
    """What must be equal on every rank for the replicas to train one model: the flags, the corpus (content
    of local files; a Hub dataset by name, config and the instances built from it), the tokenizer and the
    versions of the code. Without `data` (before the data stage): the flags, the corpus and the versions."""
    fingerprint: dict[str, Any] = {
        "flags": settings.to_dict(),
        "corpus content": corpus_fingerprint(settings.corpus),
    }
    if prepared is not None:
        fingerprint |= {
            "training instances": count_training_instances(prepared.train),  # None for a stream
            "evaluation instances": len(prepared.eval_instances),
            "tokenizer": tokenizer_fingerprint(prepared.tokenizer),
        }
    return fingerprint | {"versions": {package: version(package) for package in VERSIONED_PACKAGES}}


def differences(reference: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """'what: value (rank 0: value)' for each entry of `other` that differs from `reference`, flags and
    versions one by one."""
    found = []
    for part, value in other.items():
        expected = reference.get(part)
        if isinstance(value, dict) and isinstance(expected, dict):
            prefix = "--" if part == "flags" else ""
            found += [
                f"{prefix}{name} {value.get(name)!r} (rank 0: {expected.get(name)!r})"
                for name in sorted(value.keys() | expected.keys())
                if value.get(name) != expected.get(name)
            ]
        elif value != expected:
            found.append(f"{part} {value!r} (rank 0: {expected!r})")
    return found


def check_processes_agree(
    settings: PretrainingSettings, prepared: PreparedData | None, accelerator: Accelerator
) -> None:
    """Refuse, on every rank and before the first update, a run whose ranks disagree on what they train (one
    all_gather of every rank's `run_fingerprint`); the message names each rank, its node and what differs.
    Called twice: before work without `data` (what --dry_run sees too), and after the data stage with it."""
    if accelerator.num_processes == 1:
        return
    gathered = gather_object([(accelerator.process_index, where_am_i(), run_fingerprint(settings, prepared))])
    reference = gathered[0][2]
    disagreeing = [
        f"rank {rank} ({where}): {'; '.join(found)}"
        for rank, where, fingerprint in gathered[1:]
        if (found := differences(reference, fingerprint))
    ]
    if disagreeing:
        end_process_group(accelerator)
        raise Refusal(
            f"The processes of this run disagree with rank 0 ({gathered[0][1]}), so their replicas would drift "
            f"apart: {' | '.join(disagreeing)}. Start every node with the same command, corpus, tokenizer and "
            "hfbert, transformers and torch versions."
        )

