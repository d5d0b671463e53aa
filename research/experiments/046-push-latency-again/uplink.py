# research/046: N records to `pure-serve send` on its stdin, one every PAUSE ms (each stored in a turn of its own).
import sys, time
n, pause = int(sys.argv[1]), float(sys.argv[2]) / 1e3
for i in range(n):
    sys.stdout.write("up %d\n" % i); sys.stdout.flush()
    time.sleep(pause)
