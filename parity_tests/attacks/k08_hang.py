# caught: an endless loop
def backward(dout, cache):
    while True:
        pass
