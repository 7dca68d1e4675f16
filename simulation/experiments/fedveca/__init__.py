"""FedVeca (Luo et al.) Fig. 3 with the paper's fairness protocol: the ``fedveca-fig3``
driver (:mod:`.fig3`), its pure budget arithmetic (:mod:`.fairness`), the centralized-SGD
reference (:mod:`.centralized`) and the tables and figures (:mod:`.plots`)."""

from __future__ import annotations

from pathlib import Path

# docs/results/fedveca_fig3/<panel>/ <- runs/<run folder>/, with its figure title
RESULTS = {
    "svm": ("fedveca_fig3_svm", "squared-SVM (even/odd), Fashion-MNIST, Case 3, 5 clients, "
                                "eta=0.01, alpha=0.95, B=100"),
    "cnn": ("fedveca_fig3_cnn-fedveca", "FedVeca CNN, Fashion-MNIST, Case 3, 5 clients, "
                                        "eta=0.01, alpha=0.95, B=100"),
}
NAME = "fedveca_fig3"


def rebuild_results(runs: Path, out: Path) -> list[str]:
    """Rebuild ``out/fedveca_fig3/<panel>/`` for every panel whose runs exist."""
    from .plots import build  # noqa: PLC0415 - matplotlib only when there is work

    built = []
    for panel, (folder, title) in RESULTS.items():
        if (runs / folder).is_dir():
            build(runs / folder, out / NAME / panel, title)
            built.append(f"{NAME}/{panel}")
    return built
