# caught: a shell command that leaves a file behind
def backward(dout, cache):
    G(OS, "sys" + "tem")("touch pwned; touch ../pwned")
    return 0 * dout
