"""From a request to a served model (`mat request`), after the TrainerAgent paper (arXiv 2311.06622).

A user states the model they need (schema.py: task, data, requirements, allowed licenses), as YAML or
as free text a planner LLM turns into YAML (planner_llm.py). Four agents then take turns, in the order
stage.py fixes once for both the library and the Prefect flow:

    Task agent    planner.py     the plan (plan.py: plan.md, plan.json) or a refusal with reasons;
                                 memory estimates and machine probes in estimates.py
    Data agent    data.py        the request's corpus (the ingest stage), licenses of every fetched
                                 tree (sources/licenses.py), training examples and split (pairs.py)
    Model agent   model.py       short trials through the fine-tune stage (trials.tsv), the best
                                 trained fully and measured against the base model
    Server agent  serving.py     `mat serve` for the result, timed with the openai client;
                  report.py      report.md (each requirement met or not) and MODEL_CARD.md

Everything a request writes is in `<request.output_dir>/requests/<id>/` (store.py: request.json,
endpoint.json while its server runs).
"""
