"""`python -m worker predict --job ID IMAGE…`: classify images with a job's exported model.

One line per image, the top class first, then its probability, the image, the runners-up and
the time the image took (decode + model):

    7    98.12%    digits/7/0007.png    1 1.21%, 9 0.30%    12.4 ms

`--json` prints the same as one JSON object. The export is loaded only if its SHA-256 is the
one the worker recorded (`db.exports`); a file that is not an image gets a message on stderr,
and the others are still classified.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.cliargs import EXIT_USER_ERROR, Parser, job_id, positive_int
from db.engine import DatabaseError, DatabaseUrlError, database_problem, get_engine
from db.exports import ArtifactUnavailable, recorded_artifact
from inference.model import DEFAULT_TOP_K, LoadedModel, ModelLoadError, Prediction, load_export

EXIT_OK = 0
EXIT_SOME_IMAGES_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m worker predict",
        description="Classify images with the exported model of a job that succeeded. "
        "Prints one line per image: the top class first, then its probability.",
    )
    parser.add_argument("--job", type=job_id, required=True, metavar="ID", help="the job's id")
    parser.add_argument(
        "--top-k",
        type=positive_int,
        default=DEFAULT_TOP_K,
        metavar="K",
        help=f"how many classes to show per image (default {DEFAULT_TOP_K})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files to classify")
    return parser


def predict_file(model: LoadedModel, name: str, top_k: int) -> Prediction:
    try:
        data = Path(name).read_bytes()
    except FileNotFoundError:
        return Prediction(name, error=f"{name}: no such file")
    except IsADirectoryError:
        return Prediction(name, error=f"{name}: is a folder, not an image")
    except OSError as exc:
        return Prediction(name, error=f"{name}: cannot be read ({exc.strerror})")
    return model.predict_one(name, data, top_k)


def format_line(prediction: Prediction) -> str:
    best = prediction.top[0]
    runners_up = ", ".join(f"{score.label} {score.probability:.2%}" for score in prediction.top[1:])
    return "\t".join(
        [
            best.label,
            f"{best.probability:.2%}",
            prediction.name,
            runners_up or "-",
            f"{prediction.latency_s * 1000:.1f} ms",
        ]
    )


def _as_json(job_id: int, predictions: list[Prediction]) -> str:
    return json.dumps(
        {
            "job": job_id,
            "predictions": [
                {
                    "image": p.name,
                    "top": [{"class": s.label, "probability": s.probability} for s in p.top],
                    "latency_ms": p.latency_s * 1000,
                    "error": p.error,
                }
                for p in predictions
            ],
        },
        indent=2,
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        artifact = recorded_artifact(get_engine(), args.job, "export")
        model = load_export(artifact)
    except (ArtifactUnavailable, ModelLoadError, DatabaseUrlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except DatabaseError as exc:
        print(f"error: {database_problem(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    predictions = [predict_file(model, name, args.top_k) for name in args.images]
    if args.json:
        print(_as_json(args.job, predictions))
    for prediction in predictions:
        if prediction.error is not None:
            print(f"error: {prediction.error}", file=sys.stderr)
        elif not args.json:
            print(format_line(prediction))
    return EXIT_SOME_IMAGES_FAILED if any(p.error for p in predictions) else EXIT_OK
