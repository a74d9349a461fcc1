"""The function_call reward agrees with BFCL's own AST checker (bfcl-eval, its Python rules) on a table of cases
where the reward does not knowingly depart from it (a maximum matching of parallel calls, integer items of a float
array: see grpoplus.rewards.function_call). Skipped where bfcl-eval is not installed (it is no dependency)."""

import json

import pytest

from grpoplus.rewards.function_call import function_call_score

bfcl_checker = pytest.importorskip("bfcl_eval.eval_checker.ast_eval.ast_checker",
                                   reason="bfcl-eval is not installed: pip install bfcl-eval")

AREA = {"name": "triangle_area", "description": "Area of a triangle", "parameters": {
    "type": "dict", "required": ["base", "height"], "properties": {
        "base": {"type": "integer"}, "height": {"type": "float"}, "unit": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}}, "exact": {"type": "boolean"}}}}
CITY = {"name": "city_weather", "description": "Weather", "parameters": {
    "type": "dict", "required": ["city"], "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}
FUNCTIONS = [AREA, CITY]
TRUTH = [{"triangle_area": {"base": [10], "height": [5.0], "unit": ["cm", "centimeters", ""], "tags": [["a b", "c"], ""],
                            "exact": [True, ""]}}]
PARALLEL = [{"city_weather": {"city": ["Paris"], "days": [3, ""]}}, {"city_weather": {"city": ["New York, NY"],
                                                                                       "days": [""]}}]
CASES = [  # (model output as BFCL decodes it, ground truth, category)
    ([{"triangle_area": {"base": 10, "height": 5.0}}], TRUTH, "simple"),
    ([{"triangle_area": {"base": 10, "height": 5}}], TRUTH, "simple"),  # int for float
    ([{"triangle_area": {"base": 10.0, "height": 5.0}}], TRUTH, "simple"),  # float for integer
    ([{"triangle_area": {"base": 10, "height": 5.0, "unit": "Centi-Meters"}}], TRUTH, "simple"),
    ([{"triangle_area": {"base": 10, "height": 5.0, "unit": "inch"}}], TRUTH, "simple"),
    ([{"triangle_area": {"base": 10, "height": 5.0, "tags": ["A_B", "c"]}}], TRUTH, "simple"),
    ([{"triangle_area": {"base": 10, "height": 5.0, "tags": ["c", "a b"]}}], TRUTH, "simple"),
    ([{"triangle_area": {"base": 10, "height": 5.0, "exact": 1}}], TRUTH, "simple"),
    ([{"triangle_area": {"base": 10, "height": 5.0, "colour": "red"}}], TRUTH, "simple"),
    ([{"triangle_area": {"height": 5.0}}], TRUTH, "simple"),
    ([{"triangle_area": {"base": "10", "height": 5.0}}], TRUTH, "simple"),
    ([{"city_weather": {"city": "Paris"}}], TRUTH, "multiple"),
    ([{"triangle_area": {"base": 10, "height": 5.0}}] * 2, TRUTH, "simple"),
    ([{"city_weather": {"city": "new york ny"}}, {"city_weather": {"city": "Paris", "days": 3}}], PARALLEL, "parallel"),
    ([{"city_weather": {"city": "Paris"}}, {"city_weather": {"city": "NYC"}}], PARALLEL, "parallel"),
    ([{"city_weather": {"city": "Paris"}}], PARALLEL, "parallel"),
    ([{"city_weather": {"city": "Paris"}}, {"city_weather": {"city": "New York", "days": 2}}], PARALLEL, "parallel"),
]


def _language():
    try:
        from bfcl_eval.constants.enums import Language
    except ImportError:  # older bfcl-eval names the language with a string
        return "Python"
    return Language.PYTHON


@pytest.mark.parametrize("output, truth, category", CASES)
def test_the_reward_agrees_with_bfcls_checker(output, truth, category):
    bfcl = bfcl_checker.ast_checker(FUNCTIONS, output, truth, _language(), category, "gorilla-openfunctions-v2")
    completion = "".join(f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
                         for call in output for name, args in call.items())
    ours = function_call_score(completion, truth, FUNCTIONS, parallel="parallel" in category)
    assert ours == float(bfcl["valid"]), bfcl.get("error")
