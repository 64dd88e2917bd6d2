"""The shipped alert and recording rules for another model: ``python -m serving.prometheus_rules --model-name NAME
--out DIR``.

deploy/prometheus/rules/ is written for the model ``embedding`` (settings.MODEL_NAME) served as the
InferenceService of the same name. Only a few spots name it: the ``model_name`` and ``ModelName`` label values that
select the model's series, and the InferenceService (and its NetworkPolicy) in the runbooks' kubectl lines. This
rewrites exactly those; the recorded series keep their ``embedding:`` names (a namespace of this project's rules,
told apart per server by their job and instance labels) and the scrape jobs keep theirs (prometheus.yml names them).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from cli_common import EXIT_USAGE, Parser, UsageError, fail
from owned_paths import mark, replaceable_dir
from settings import MODEL_NAME, REPO, SettingsError, check_model_name, service_name_for

RULES_DIR = REPO / "deploy" / "prometheus" / "rules"
KIND = "prometheus-rules"
PROG = "python -m serving.prometheus_rules"
#: The spots of the shipped rules that name the model's label value, and its InferenceService (group 1 kept).
MODEL_LABEL = re.compile(rf'\b((?:model_name|ModelName)=)"{re.escape(MODEL_NAME)}"')
SERVICE = re.compile(rf"(inferenceservice[= ]|networkpolicy |--service-name ){re.escape(service_name_for(MODEL_NAME))}\b")


def for_model(text: str, model: str, service: str | None = None) -> str:
    """Rule file `text` for `model` served as InferenceService `service` (default: the pipeline's name for it)."""
    text = MODEL_LABEL.sub(lambda m: f'{m.group(1)}"{model}"', text)
    return SERVICE.sub(lambda m: f"{m.group(1)}{service or service_name_for(model)}", text)


def render_rules(out: Path, model: str, service: str | None = None, rules_dir: Path = RULES_DIR) -> list[Path]:
    """Every shipped rule file, for `model`, into `out` (made if missing); the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(rules_dir.glob("*.yml")):
        (out / path.name).write_text(for_model(path.read_text(), model, service))
        written.append(out / path.name)
    return written


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=PROG, description=__doc__)
    p.add_argument("--model-name", required=True, help="the TorchServe model name the rules select")
    p.add_argument("--service", default=None,
                   help="the InferenceService named in the runbooks (default: derived from --model-name, as the "
                        "pipeline's deploy derives it)")
    p.add_argument("--out", type=Path, required=True, help="a new or empty folder, or one this command wrote")
    args = p.parse_args(argv)
    try:
        check_model_name(args.model_name)
        replaceable_dir(args.out, KIND, "--out", reads=[RULES_DIR], known=["*.yml"])
    except (UsageError, SettingsError) as exc:
        return fail(PROG, exc, EXIT_USAGE)
    for path in render_rules(args.out, args.model_name, args.service):
        print(path)
    mark(args.out, KIND, PROG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
