-- +goose NO TRANSACTION
-- +goose Up
-- A user's trusted devices are forgotten whenever their password is set or changed, their
-- sessions are ended everywhere, or they are disabled (access/devices.go forgetDevices:
-- DELETE ... WHERE email = $1); without this index each of those read the whole table.
--
-- CONCURRENTLY, outside a transaction, like 00571: every sign-in writes staff_devices. Dropped
-- first, so a build that failed half-way (an INVALID index) is built anew by running
-- `pitlane migrate` again.
DROP INDEX CONCURRENTLY IF EXISTS staff_devices_email;
CREATE INDEX CONCURRENTLY staff_devices_email ON staff_devices (email);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS staff_devices_email;
