"""prepare: a POC with the job's site names; start: server and sites; submit: nvflare job submit, wait, download; stop:
shut down and end every process start recorded (--clean: delete the workspace); run: all of these, stopping even on
failure."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..flare.protocol import CODE_DELIVERIES
from .options import POC_DEFAULT_JOB, user_path

NAME = "poc"
HELP = "rehearse a deployment with nvflare poc, isolated in its own workspace and config home"


POC_STEPS = ("prepare", "start", "submit", "stop", "run")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("step", choices=POC_STEPS)
    parser.add_argument(
        "--job", type=user_path, default=POC_DEFAULT_JOB, help=f"job folder (default {POC_DEFAULT_JOB})"
    )
    parser.add_argument(
        "--workspace", type=user_path, default=Path("poc/workspace"), help="POC workspace (default poc/workspace)"
    )
    parser.add_argument("--code", choices=CODE_DELIVERIES, default="byoc", help="prepare/run: the sites' code policy")
    parser.add_argument(
        "--as",
        dest="user",
        default="project_admin",
        help="submit/run: submit as this role (project_admin, lead, org_admin, member) or user name",
    )
    parser.add_argument("--out", type=user_path, default=Path("results/poc"), help="submit/run: download folder")
    parser.add_argument("--timeout", type=float, default=3600, help="submit/run: seconds to wait for the job")
    parser.add_argument(
        "--clean", action="store_true", help="stop: also delete the workspace (run: deletes it when the job completes)"
    )


def run(args: argparse.Namespace) -> int:
    from ..flare.poc import USERS, PocWorkspace  # imports FLARE: only for this command

    poc = PocWorkspace(args.workspace)
    user = USERS.get(args.user, args.user)
    if args.step == "prepare":
        sites = poc.prepare(args.job, args.code)
        print(f"POC prepared in {poc.root} for {', '.join(sites)} ({args.code}); next: surgical-aggregation poc start")
        return 0
    if args.step == "start":
        record = poc.start()
        print(f"POC started (process group {record['process_group']}); logs: {poc.prod_dir}/<participant>/log.txt")
        return 0
    if args.step == "stop":
        poc.stop()
        if args.clean:
            poc.clean()
        print("POC stopped" + (" and its workspace deleted" if args.clean else ""))
        return 0
    if args.step == "submit":
        outcome = poc.submit_and_collect(args.job, user, args.out, args.timeout)
    else:
        outcome = poc.run(args.job, args.code, user, args.out, args.timeout)
    print(f"job {outcome.job_id}: {outcome.state}; downloaded to {outcome.downloaded} (models: workspace/app_server/)")
    if not outcome.completed:
        print(f"the participants' logs: {poc.prod_dir}/<participant>/{outcome.job_id}/log.txt", file=sys.stderr)
    return 0 if outcome.completed else 1
