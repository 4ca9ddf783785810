"""`python -m eagle_core.train configs/train/smollm2.yaml [--stages ...] [--set key=value ...]`."""

from __future__ import annotations

import argparse
import logging
import os

from eagle_core.train.common import set_threads
from eagle_core.train.config import load_config

STAGES = ("prompts", "generate", "corpus", "features", "train", "validate", "eval")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eagle_core.train", description=__doc__)
    parser.add_argument("config", help="YAML training config (configs/train/*.yaml)")
    parser.add_argument(
        "--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}"
    )
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    cfg = load_config(args.config, args.set)
    os.makedirs(cfg.work_dir, exist_ok=True)
    set_threads(cfg.num_threads)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
    for stage in STAGES:
        if stage not in stages:
            continue
        logging.getLogger(__name__).info("stage %s", stage)
        if stage == "prompts":
            from eagle_core.train.generate import run_prompts

            run_prompts(cfg)
        elif stage == "generate":
            from eagle_core.train.generate import run_generate

            if cfg.generate.enabled:
                run_generate(cfg)
        elif stage == "corpus":
            from eagle_core.train.corpus import run_corpus

            if cfg.corpus.enabled:
                run_corpus(cfg)
        elif stage == "features":
            from eagle_core.train.features import run_features

            run_features(cfg)
        elif stage == "train":
            from eagle_core.train.trainer import run_train

            run_train(cfg)
        elif stage == "validate":
            from eagle_core.train.trainer import run_validate

            run_validate(cfg)
        elif stage == "eval":
            from eagle_core.train.evaluate import run_eval

            run_eval(cfg)


if __name__ == "__main__":
    main()
