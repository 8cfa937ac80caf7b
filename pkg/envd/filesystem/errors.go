package filesystem

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"syscall"

	"connectrpc.com/connect"
)

// Error turns an OS error about path into a Connect error with the code the
// e2b SDK maps: NotFound (FileNotFoundError, and exists() answers false),
// AlreadyExists (makeDir answers false), InvalidArgument, PermissionDenied.
// what says what was being done, for the message.
func Error(what, path string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(Code(err), fmt.Errorf("%s %q: %w", what, path, unwrapPath(err)))
}

// Code is the Connect code of an OS error.
func Code(err error) connect.Code {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.CodeNotFound
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EXDEV),
		errors.Is(err, syscall.ENOTSUP), errors.Is(err, syscall.E2BIG): // the last two: metadata a filesystem cannot keep
		return connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return connect.CodeResourceExhausted
	}
	return connect.CodeInternal
}

// HTTPStatus is the status of an OS error on the /files endpoints, as the
// SDK maps them: 404 FileNotFoundError, 400 InvalidArgumentError, 507
// NotEnoughSpaceError.
func HTTPStatus(err error) int {
	switch Code(err) {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeInvalidArgument, connect.CodeAlreadyExists:
		return http.StatusBadRequest
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// unwrapPath drops a *fs.PathError's own operation and path, which the
// message already names, keeping its cause ("no such file or directory").
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}
