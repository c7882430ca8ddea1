import kernel_env  # noqa: F401  (first: the kernelspec under test)
