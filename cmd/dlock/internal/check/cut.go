package check

import (
	"sync"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

// cutToxicType names cutToxic in toxiproxy's registry.
const cutToxicType = "dlock-cut"

var registerCut sync.Once

// registerCutToxic adds cutToxic to toxiproxy's registry, once per process.
func registerCutToxic() { registerCut.Do(func() { toxics.Register(cutToxicType, new(cutToxic)) }) }

// cutToxic stands for a cut cable on one direction of a proxied connection: while
// it is in place every byte sent that way is dropped and nothing is closed, so the
// peers see silence. Removing it closes the connection in that direction, since
// the bytes it dropped leave the stream broken for good.
//
// It does what toxiproxy's timeout toxic with timeout 0 does, with one difference.
// When the timeout toxic is removed it closes its stub and leaves the toxic before
// it in the chain sending into the closed stub's input, which nobody reads any
// more: the first chunk that arrives after the heal blocks that goroutine for the
// life of the process. cutToxic's Cleanup keeps reading that input until the
// sender closes it, which it does once the connection's source ends.
type cutToxic struct{}

// Pipe drops what arrives until it is interrupted or its input ends.
func (*cutToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
		}
	}
}

// Cleanup runs when the toxic is removed: it closes the stub's output (ending the
// connection that way) and drains its input until the sender closes it.
func (*cutToxic) Cleanup(stub *toxics.ToxicStub) {
	go func(in <-chan *stream.StreamChunk) {
		for range in {
		}
	}(stub.Input)
	stub.Close()
}
