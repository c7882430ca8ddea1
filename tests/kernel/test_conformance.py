"""jupyter_kernel_test's conformance suite against the magpy kernel, every attribute filled."""

import unittest

import kernel_env  # noqa: F401
import jupyter_kernel_test


class MagpyKernelTests(jupyter_kernel_test.KernelTests):
    kernel_name = kernel_env.KERNEL_NAME
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('oops', file=sys.stderr)"

    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "import magp", "matches": {"magpy"}},
    ]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n",
                             "%timeit -n1 -r1 pass"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2", "for i in range(3):"]
    invalid_code_samples = ["import = 7q", "x = )"]

    code_page_something = "zip?"
    code_generate_error = "raise ValueError('an error')"

    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
        {"code": "{'a': 1}", "mime": "text/plain", "result": "{'a': 1}"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
         "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
         "mime": "text/latex"},
        # jupyter_kernel_test wants the MIME type in *every* display_data of a sample, and a
        # %%magpy cell shows seven different ones: one real view (the guards of a function
        # compiled and called in the kernel); all of them are checked in
        # tests/ipython/test_kernel_display.py and test_notebooks.py
        {"code": "import json, magpy, torch\nfrom magpy import _views\n"
                 "from IPython.display import display\n"
                 "cf = magpy.compile(lambda x: x * 2); cf(torch.ones(2))\n"
                 "display(_views.build_view('guards', json.loads(magpy.explain(cf).to_json()),"
                 " {}), raw=True)",
         "mime": "application/vnd.magpy.guards+json"},
    ]

    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")

    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


if __name__ == "__main__":
    unittest.main()
