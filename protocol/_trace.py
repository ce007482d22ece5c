import os, time
def t(tag):
    fd = os.open("/tmp/trace.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{time.monotonic()*1000:.2f} {os.getpid()} {tag} {time.process_time()*1000:.2f}\n".encode()); os.close(fd)
