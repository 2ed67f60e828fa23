# caught: the child kills itself with a signal mid-check (where signals are allowed at all)
def backward(dout, cache):
    OS.kill(OS.getpid(), IMPORT("signal").SIGSEGV)
    return 0 * dout
