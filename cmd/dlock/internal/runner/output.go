package runner

import (
	"io"
	"os"
	"time"
)

// outputWait bounds the wait for the command's output once its group is gone: a
// process that left the group may still hold the pipe.
const outputWait = 2 * time.Second

// copier copies what the command writes to a pipe into a writer that is not a file.
// exec.Cmd would do it itself, but then Wait would wait for every process holding
// the pipe, the processes left in the group included, and the runner could not tell
// that the command exited and stop them.
type copier struct {
	r, w *os.File
	done chan struct{}
}

// fileFor returns w as a file to give the command: w itself if it is one, else the
// write end of a pipe copied into w.
func fileFor(w io.Writer) (*os.File, *copier, error) {
	if f, ok := w.(*os.File); ok {
		return f, nil, nil
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	c := &copier{r: r, w: pw, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		_, _ = io.Copy(w, r)
	}()
	return pw, c, nil
}

// started closes the runner's copy of the write end, once the command has its own.
func (c *copier) started() {
	if c != nil {
		c.w.Close()
	}
}

// finish waits for the copy to reach the end of the output, at most outputWait, and
// closes the pipe.
func (c *copier) finish() {
	if c == nil {
		return
	}
	c.w.Close()
	select {
	case <-c.done:
	case <-time.After(outputWait):
	}
	c.r.Close()
	<-c.done
}

// sameWriter reports whether a and b are the same writer (false if they cannot be
// compared).
func sameWriter(a, b io.Writer) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}
