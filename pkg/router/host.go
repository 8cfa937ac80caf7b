package router

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// sandboxHost reads the sandbox and port a request's Host names, E2B's
// "<port>-<sandbox id>.<domain>" (the SDK's getHost, and every URL it
// builds when E2B_SANDBOX_URL is unset). named is false for a Host that is
// not under domain (or with no domain set): the headers name the sandbox
// then. A Host under domain that is not of that form is an error, in the
// words the answer gives.
func sandboxHost(host, domain string) (id string, port int, named bool, err error) {
	if domain == "" {
		return "", 0, false, nil
	}
	if h, _, splitErr := net.SplitHostPort(host); splitErr == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, under := strings.CutSuffix(host, "."+domain)
	if !under {
		return "", 0, false, nil
	}
	ps, id, ok := strings.Cut(label, "-")
	p, perr := strconv.ParseUint(ps, 10, 16)
	switch {
	case !ok || strings.Contains(label, ".") || perr != nil || p == 0:
		return "", 0, true, fmt.Errorf("host %q names no sandbox: want <port>-<sandbox id>.%s", clip(host), domain)
	case len(validation.IsValidLabelValue(id)) > 0 || id == "":
		return "", 0, true, fmt.Errorf("host %q: %q is no sandbox id", clip(host), clip(id))
	}
	return id, int(p), true, nil
}

// target is the sandbox and port a request is for: its Host's, when the
// Host names one, else its headers'. A request whose headers name another
// sandbox or port than its Host is refused: which one it meant is unknown.
func target(r *http.Request, domain string) (string, int, error) {
	id, port, named, err := sandboxHost(r.Host, domain)
	if err != nil {
		return "", 0, err
	}
	if named {
		if hid := r.Header.Get(HeaderSandboxID); hid != "" && hid != id {
			return "", 0, fmt.Errorf("header %s names sandbox %q, the host %q", HeaderSandboxID, clip(hid), id)
		}
		if hp := r.Header.Get(HeaderSandboxPort); hp != "" && hp != strconv.Itoa(port) {
			return "", 0, fmt.Errorf("header %s names port %q, the host %d", HeaderSandboxPort, clip(hp), port)
		}
		return id, port, nil
	}
	id, err = single(r.Header, HeaderSandboxID)
	if err != nil {
		return "", 0, err
	}
	if errs := validation.IsValidLabelValue(id); len(errs) > 0 {
		return "", 0, fmt.Errorf("header %s: %q is no sandbox id", HeaderSandboxID, clip(id))
	}
	ps, err := single(r.Header, HeaderSandboxPort)
	if err != nil {
		return "", 0, err
	}
	p, perr := strconv.ParseUint(ps, 10, 16)
	if perr != nil || p == 0 {
		return "", 0, fmt.Errorf("header %s: %q is no port (1 to 65535)", HeaderSandboxPort, clip(ps))
	}
	return id, int(p), nil
}
