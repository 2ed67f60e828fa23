# caught: a 50 GB allocation
def backward(dout, cache):
    huge = np.ones(50 * 10**9 // 8)
    return 0 * dout + huge[0]
